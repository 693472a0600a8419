package protocol_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

func TestTaskTypeDeclJSON(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		in   string
		want protocol.TaskTypeDecl
		out  string // what Encode writes back
		err  string // part of the decoding error; "" for none
	}{
		{name: "BareName", in: `"TEXT_REVERSE"`, want: protocol.Named("TEXT_REVERSE"), out: `"TEXT_REVERSE"`},
		{name: "Declaration", in: `{"name":"T","schema":{"type":"object"},"options":{"maxAttempts":2,"timeoutMillis":50,"concurrency":1}}`,
			want: protocol.TaskTypeDecl{Name: "T", Schema: json.RawMessage(`{"type":"object"}`),
				Options: protocol.TaskTypeOptions{MaxAttempts: 2, TimeoutMillis: 50, Concurrency: 1}, Declared: true},
			out: `{"name":"T","schema":{"type":"object"},"options":{"maxAttempts":2,"timeoutMillis":50,"concurrency":1}}`},
		{name: "DeclarationWithoutSchema", in: `{"name":"T","schema":null}`,
			want: protocol.TaskTypeDecl{Name: "T", Declared: true}, out: `{"name":"T"}`},
		{name: "Number", in: `5`, err: "taskTypes"},
		{name: "Array", in: `["T"]`, err: "taskTypes"},
		{name: "BadOptions", in: `{"name":"T","options":{"concurrency":"2"}}`, err: "concurrency"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got protocol.TaskTypeDecl
			err := json.Unmarshal([]byte(tc.in), &got)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Unmarshal(%s) = %v, want an error mentioning %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Unmarshal(%s): %v", tc.in, err)
			}
			if got.Name != tc.want.Name || string(got.Schema) != string(tc.want.Schema) ||
				got.Options != tc.want.Options || got.Declared != tc.want.Declared {
				t.Fatalf("Unmarshal(%s) = %+v, want %+v", tc.in, got, tc.want)
			}
			out, err := json.Marshal(got)
			if err != nil || string(out) != tc.out {
				t.Fatalf("Marshal = %s, %v; want %s", out, err, tc.out)
			}
		})
	}
}

func TestCheckTaskTypeName(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"TEXT_REVERSE": true, "image.resize-v2": true, strings.Repeat("A", 128): true,
		"": false, "has space": false, "a/b": false, "a*": false, strings.Repeat("A", 129): false,
	} {
		err := protocol.CheckTaskTypeName(name)
		if (err == nil) != ok || (err != nil && !errors.Is(err, protocol.ErrBadTaskTypeName)) {
			t.Errorf("CheckTaskTypeName(%.20q) = %v, want ok=%v", name, err, ok)
		}
	}
}

// TestTaskTypeOptionsTimeoutBound: an execution deadline is a time.Duration, so the
// longest timeout is the most whole milliseconds one holds; one more is refused rather
// than wrapping round to a deadline already past.
func TestTaskTypeOptionsTimeoutBound(t *testing.T) {
	t.Parallel()
	if err := (protocol.TaskTypeOptions{TimeoutMillis: protocol.MaxTimeoutMillis}).Check(); err != nil {
		t.Fatalf("timeoutMillis %d: %v", protocol.MaxTimeoutMillis, err)
	}
	if d := time.Duration(protocol.MaxTimeoutMillis) * time.Millisecond; d <= 0 {
		t.Fatalf("timeoutMillis %d is %v", protocol.MaxTimeoutMillis, d)
	}
	err := (protocol.TaskTypeOptions{TimeoutMillis: protocol.MaxTimeoutMillis + 1}).Check()
	if want := "timeoutMillis must be in 0..9223372036854, got 9223372036855"; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}
