package coordinator

import (
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/tasktype"
)

// benchCatalogue holds one custom type as the worker of `jobbus bench --custom`
// declares it, for comparing its validation with a built-in's.
func benchCatalogue(tb testing.TB) *catalogue {
	tb.Helper()
	cat := newCatalogue(tasktype.Builtins(), slog.New(slog.DiscardHandler))
	raw := json.RawMessage(`{"properties":{"text":{"type":"string","maxLength":200000}},"type":"object","required":["text"]}`)
	schema, err := compileSchema("BENCH_SHA256", raw)
	if err != nil {
		tb.Fatal(err)
	}
	cat.types["BENCH_SHA256"] = &catalogued{rec: protocol.TaskTypeRecord{Name: "BENCH_SHA256", Schema: raw}, schema: schema}
	return cat
}

func TestCatalogueValidate(t *testing.T) {
	t.Parallel()
	cat := benchCatalogue(t)
	for _, tc := range []struct {
		taskType, payload, want string // want: "" valid, "unknown", or the PayloadError's text
	}{
		{"BENCH_SHA256", `{"text":"a"}`, ""},
		{"BENCH_SHA256", ` {"text":"a","extra":[1]} `, ""},
		{"BENCH_SHA256", `{}`, "missing property 'text'"},
		{"BENCH_SHA256", `{"text":null}`, "at '/text': got null, want string"},
		{"BENCH_SHA256", `{"text":"a"} trailing`, "Payload must be a JSON object"},
		{"BENCH_SHA256", ``, "Payload must be a JSON object"},
		{"SHA256", `{"text":5}`, "Field 'text' must be a string"},
		{"NOPE", `{}`, "unknown"},
	} {
		err := cat.validate(tc.taskType, json.RawMessage(tc.payload))
		var pe *tasktype.PayloadError
		switch {
		case tc.want == "" && err != nil, tc.want == "unknown" && !errors.Is(err, tasktype.ErrUnknown):
			t.Errorf("%s %s: %v, want %q", tc.taskType, tc.payload, err, tc.want)
		case tc.want != "" && tc.want != "unknown" && (!errors.As(err, &pe) || pe.Message != tc.want):
			t.Errorf("%s %s: %v, want %q", tc.taskType, tc.payload, err, tc.want)
		}
	}
}

// TestCatalogueValidateUnderRef: a schema that refers to itself (a tree, as HandleJSON
// derives for a recursive type, or "$ref": "#") names every problem below a $ref, as it
// does without one, rather than "validation failed".
func TestCatalogueValidateUnderRef(t *testing.T) {
	t.Parallel()
	cat := newCatalogue(tasktype.Builtins(), slog.New(slog.DiscardHandler))
	for name, raw := range map[string]string{
		"DEFS": `{"$ref":"#/$defs/node","$defs":{"node":{"type":"object","required":["name"],` +
			`"properties":{"name":{"type":"string","minLength":1},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}}}}}`,
		"ROOT": `{"type":"object","required":["name"],` +
			`"properties":{"name":{"type":"string","minLength":1},"children":{"type":"array","items":{"$ref":"#"}}}}`,
	} {
		schema, err := compileSchema(name, json.RawMessage(raw))
		if err != nil {
			t.Fatal(err)
		}
		cat.types[name] = &catalogued{rec: protocol.TaskTypeRecord{Name: name, Schema: json.RawMessage(raw)}, schema: schema}
	}
	for _, tc := range []struct{ payload, want string }{
		{`{"name":"a","children":[{"name":"b","children":[{"name":"c"}]}]}`, ""},
		{`{"name":""}`, "at '/name': minLength: got 0, want 1"},
		{`{"name":"a","children":[{"name":"b","children":[{"name":""}]}]}`, "at '/children/0/children/0/name': minLength: got 0, want 1"},
		{`{"name":"a","children":[{"name":"b"},{"name":5,"children":[{}]}]}`,
			"at '/children/1/name': got number, want string; at '/children/1/children/0': missing property 'name'"},
	} {
		for _, taskType := range []string{"DEFS", "ROOT"} {
			err := cat.validate(taskType, json.RawMessage(tc.payload))
			var pe *tasktype.PayloadError
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s %s: %v, want valid", taskType, tc.payload, err)
			case tc.want != "" && (!errors.As(err, &pe) || !sameProblems(pe.Message, tc.want)):
				t.Errorf("%s %s: %v, want %q", taskType, tc.payload, err, tc.want)
			}
		}
	}
}

// sameProblems reports whether two "; "-joined lists of problems hold the same ones: the
// validator visits an object's properties in no fixed order.
func sameProblems(a, b string) bool {
	pa, pb := strings.Split(a, "; "), strings.Split(b, "; ")
	slices.Sort(pa)
	slices.Sort(pb)
	return slices.Equal(pa, pb)
}

// BenchmarkValidate compares the validation of a submission of a built-in type with
// that of a custom type checked against its JSON Schema, as bench submits them.
//
//	go test -run '^$' -bench Validate -benchmem ./coordinator/
func BenchmarkValidate(b *testing.B) {
	cat := benchCatalogue(b)
	payload := json.RawMessage(`{"text":"jobbus"}`)
	for _, taskType := range []string{"SHA256", "BENCH_SHA256"} {
		b.Run(taskType, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := cat.validate(taskType, payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzCatalogueValidate feeds a custom type's schema validation what a SUBMIT_JOB may
// carry: it never panics, and answers nil or a *PayloadError, never anything else.
func FuzzCatalogueValidate(f *testing.F) {
	for _, seed := range []string{`{"text":"a"}`, `{}`, `{"text":5}`, `[]`, `null`, ``, `{"text":"a"} x`,
		`{"text":"\u0000"}`, `{"text":1e400}`, `{"a":{"a":{"a":[[[[[]]]]]}}}`, `{"text":"a","text":7}`} {
		f.Add([]byte(seed))
	}
	cat := benchCatalogue(f)
	f.Fuzz(func(t *testing.T, payload []byte) {
		err := cat.validate("BENCH_SHA256", payload)
		var pe *tasktype.PayloadError
		if err != nil && !errors.As(err, &pe) {
			t.Fatalf("validate(%q) = %v, want nil or a *PayloadError", payload, err)
		}
		if err == nil && !json.Valid(payload) {
			t.Fatalf("validate accepted invalid JSON %q", payload)
		}
	})
}
