package protocol_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

func TestCheckRunTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC).UnixMilli()
	for _, tc := range []struct {
		name      string
		at, in    int64
		want      int64
		errSubstr string
	}{
		{"at", now + 5000, 0, now + 5000, ""},
		{"in", 0, 600_000, now + 600_000, ""},
		{"at in the past stands (runs now)", now - 5000, 0, now - 5000, ""},
		{"both", now + 1, 1, 0, "give runAtMillis or runInMillis, not both"},
		{"negative in", 0, -1, 0, "runInMillis must be at least 0, got -1"},
		{"seconds for milliseconds", now / 1000, 0, 0, "before 2000-01-01"},
		{"negative at", -5, 0, 0, "before 2000-01-01"},
		{"microseconds for milliseconds", now * 1000, 0, 0, "more than 3660 days ahead (microseconds given?)"},
		{"in too far", 0, protocol.MaxRunAhead.Milliseconds() + 1, 0, "more than 3660 days ahead"},
		{"at the bound", now + protocol.MaxRunAhead.Milliseconds(), 0, now + protocol.MaxRunAhead.Milliseconds(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, perr := protocol.CheckRunTime(tc.at, tc.in, now)
			switch {
			case tc.errSubstr == "" && perr != nil:
				t.Fatalf("refused: %s", perr.Message)
			case tc.errSubstr == "" && got != tc.want:
				t.Fatalf("due %d, want %d", got, tc.want)
			case tc.errSubstr != "" && (perr == nil || !strings.HasPrefix(perr.Message, "Invalid run time: ") || !strings.Contains(perr.Message, tc.errSubstr)):
				t.Fatalf("error %v, want one with %q", perr, tc.errSubstr)
			}
		})
	}
}

// TestDecodeKeepsExtensionFields: the scanner of the hot messages leaves a member of
// an extension field to encoding/json rather than skipping it, so that a submission's
// run time (and every other extension) arrives, wherever its member is.
func TestDecodeKeepsExtensionFields(t *testing.T) {
	t.Parallel()
	for _, data := range []string{
		`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"maxAttempts":0,"idempotencyKey":null,"priority":null,"runAtMillis":1796000000000,"queue":"q"}`,
		`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"runAtMillis":1796000000000,"queue":"q"}`,
		`{"runAtMillis":1796000000000,"type":"SUBMIT_JOB","queue":"q","taskType":"SHA256","payload":{"text":"x"}}`,
	} {
		m, _, err := protocol.DecodeExact([]byte(data))
		if err != nil {
			t.Fatal(err)
		}
		if s := m.(*protocol.SubmitJob); s.RunAtMillis != 1796000000000 || s.Queue != "q" || s.TaskType != "SHA256" {
			t.Errorf("%s decoded to %+v", data, s)
		}
		var s protocol.SubmitJob
		if err := s.DecodeJSON([]byte(data)); err != nil || s.RunAtMillis != 1796000000000 {
			t.Errorf("DecodeJSON(%s) = %+v, %v", data, s, err)
		}
	}
}
