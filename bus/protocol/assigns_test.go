package protocol

import (
	"encoding/json"
	"reflect"
	"testing"
)

var assignsSeeds = []string{
	`{"assigns":[{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"SHA256","payload":{"text":"x"}}]}`,
	`{"assigns":[{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"SHA256","payload":{"text":"x"}},{"type":"TASK_ASSIGN","jobId":"k","attemptId":"b","attemptNumber":3,"taskType":"SLEEP","payload":{"ms":5},"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"a=b"}]}`,
	`{"assigns":[{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"SHA256","payload":null}]}`,
	`{"assigns":[{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"SHA256","payload":{"text":"\u003cb\u003e"}}]}`,
	`{"assigns":[{"type":"TASK_ASSIGN","jobId":"é","attemptId":"a","attemptNumber":1,"taskType":"SHA256","payload":{}}]}`,
	`{"assigns":[{"type":"OTHER","jobId":"j","attemptNumber":1.5}]}`,
	`{"assigns":[{"jobId":"j","attemptNumber":"1"}]}`,
	`{"assigns":[]}`,
	`{"assigns":null}`,
	`{"assigns":[null]}`,
	`{"assigns":[{}]}`,
	`{"assigns":[1]}`,
	`{"assigns":[{"jobId":"j"},]}`,
	`{"assigns":[{"jobId":"j"}]} `,
	`{"assigns":[{"jobId":"j"}]`,
	`{"assigns":[{"jobId":"j","jobId":"k"}],"assigns":[]}`,
	`{"Assigns":[{"JOBID":"j"}]}`,
	`{"assigns":[{"payload":[1,2]},{"payload":{"a":[{}]}}]}`,
	`{"assigns":[{"jobId":"` + "\xff" + `"}]}`,
	`null`, `[]`, `{}`, ``, `{"assigns":1}`,
}

// FuzzAssignsDecode holds TaskAssigns' DecodeJSON to json.Unmarshal: the same fields
// set, the same error, from a zero batch and from one with assignments set; and its
// MarshalJSON to encoding/json's encoding of whatever was read. Seeds here and in
// testdata/fuzz/FuzzAssignsDecode.
func FuzzAssignsDecode(f *testing.F) {
	for _, s := range assignsSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkBatchCodec(t, data, []func() *TaskAssigns{
			func() *TaskAssigns { return new(TaskAssigns) },
			func() *TaskAssigns {
				return &TaskAssigns{Assigns: []TaskAssign{{JobID: "j0", Payload: json.RawMessage(`{"a":1}`)}}}
			},
		}, func(m *TaskAssigns) ([]byte, error) {
			type plain TaskAssigns
			return json.Marshal((*plain)(m))
		})
	})
}

// TestAssignsRoundTrip: a batch as the coordinator sends it is read back whole by the
// one-pass decoder, and each assignment in it is written as a TASK_ASSIGN sent alone.
func TestAssignsRoundTrip(t *testing.T) {
	in := TaskAssigns{Assigns: []TaskAssign{
		{JobID: "j1", AttemptID: "a1", AttemptNumber: 1, TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`)},
		{JobID: "j2", AttemptID: "a2", AttemptNumber: 2, TaskType: "SLEEP", Payload: json.RawMessage(`{"ms":5}`),
			TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{JobID: "j3", AttemptID: "a3-é", AttemptNumber: 1, TaskType: "WORD_COUNT", Payload: json.RawMessage(`{"text":"é"}`)}, // beyond ASCII: encoding/json's
	}}
	data, err := in.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var out TaskAssigns
	if err := out.DecodeJSON(data); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("read back %+v from %s, want %+v", out, data, in)
	}
	one, _ := in.Assigns[0].MarshalJSON()
	if want := `{"assigns":[` + string(one) + `,`; string(data[:len(want)]) != want {
		t.Fatalf("batch %s does not start with the assignment as sent alone, %s", data, one)
	}
	if _, fast := scanAssigns(data[:0:0]); fast {
		t.Fatal("an empty input read as a batch")
	}
	ascii := TaskAssigns{Assigns: in.Assigns[:2]}
	data, _ = ascii.MarshalJSON()
	if _, fast := scanAssigns(data); !fast {
		t.Fatalf("%s, as MarshalJSON writes it, left to encoding/json", data)
	}
}

// FuzzSplitAssigns holds SplitAssigns to json.Unmarshal into []json.RawMessage: the
// same assignments, byte for byte, and an error exactly when it errs.
func FuzzSplitAssigns(f *testing.F) {
	for _, s := range assignsSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want struct {
			Assigns []json.RawMessage `json:"assigns"`
		}
		werr := json.Unmarshal(data, &want)
		got, err := SplitAssigns(data)
		if (err != nil) != (werr != nil) {
			t.Fatalf("SplitAssigns(%q) error %v, json.Unmarshal's %v", data, err, werr)
		}
		if err != nil {
			return
		}
		if len(got) != len(want.Assigns) || (got == nil) != (want.Assigns == nil) {
			t.Fatalf("SplitAssigns(%q) = %q, want %q", data, got, want.Assigns)
		}
		for i := range got {
			if string(got[i]) != string(want.Assigns[i]) {
				t.Fatalf("SplitAssigns(%q)[%d] = %s, want %s", data, i, got[i], want.Assigns[i])
			}
		}
	})
}

// TestSplitAssignsAsSentAlone: each assignment cut from a batch as the coordinator
// writes it is the bytes of that assignment sent alone.
func TestSplitAssignsAsSentAlone(t *testing.T) {
	in := TaskAssigns{Assigns: []TaskAssign{
		{JobID: "j1", AttemptID: "a1", AttemptNumber: 1, TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`)},
		{JobID: "j2", AttemptID: "a2", AttemptNumber: 2, TaskType: "SLEEP", Payload: json.RawMessage(`{"ms":5}`),
			TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{JobID: "j3", AttemptID: "a3-é", AttemptNumber: 1, TaskType: "WORD_COUNT", Payload: json.RawMessage(`{"text":"é"}`)},
	}}
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := SplitAssigns(data)
	if err != nil || len(got) != len(in.Assigns) {
		t.Fatalf("SplitAssigns = %q, %v", got, err)
	}
	for i := range in.Assigns {
		alone, err := json.Marshal(in.Assigns[i])
		if err != nil {
			t.Fatal(err)
		}
		if string(got[i]) != string(alone) {
			t.Errorf("assignment %d cut as %s, sent alone as %s", i, got[i], alone)
		}
	}
}
