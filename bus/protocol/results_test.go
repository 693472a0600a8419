package protocol

import (
	"encoding/json"
	"reflect"
	"testing"
)

var resultsSeeds = []string{
	`{"workerId":"w-1","results":[{"type":"TASK_RESULT","workerId":"w-1","jobId":"j","attemptId":"a","success":true,"result":"ok","error":null}]}`,
	`{"workerId":"w-1","results":[{"type":"TASK_RESULT","workerId":"w-1","jobId":"j","attemptId":"a","success":true,"result":"ok","error":null},{"type":"TASK_RESULT","workerId":"w-1","jobId":"k","attemptId":"b","success":false,"result":null,"error":"boom \u003cb\u003e","permanent":true,"snoozeMillis":5}]}`,
	`{"workerId":"w-1","results":[]}`,
	`{"workerId":"w-1","results":null}`,
	`{"workerId":"w-1","results":[null]}`,
	`{"workerId":"w-1","results":[{}]}`,
	`{"workerId":"w-1","results":[1]}`,
	`{"workerId":"w-1","results":[{"jobId":"j"},]}`,
	`{"workerId":"w-1","results":[{"jobId":"j"}]} `,
	`{"workerId":"w-1","results":[{"jobId":"j"}]`,
	`{"workerId":"w\u00e9","results":[]}`,
	`{"workerId":"w\"","results":[]}`,
	`{"results":[{"jobId":"j"}],"workerId":"w"}`,
	`{"workerId":"w","results":[{"jobId":"j","jobId":"k"}],"results":[]}`,
	`{"workerId":"w","Results":[{"JOBID":"j"}]}`,
	`{"workerId":"w","results":[{"type":"OTHER","jobId":"j","success":"yes"}]}`,
	`{"workerId":"` + "\xff" + `","results":[]}`,
	`null`, `[]`, `{}`, ``, `{"workerId":1}`,
}

// FuzzResultsDecode holds TaskResults' DecodeJSON to json.Unmarshal: the same fields
// set, the same error, from a zero batch and from one with fields set; and its
// MarshalJSON to encoding/json's encoding of whatever was read. Seeds here and in
// testdata/fuzz/FuzzResultsDecode.
func FuzzResultsDecode(f *testing.F) {
	for _, s := range resultsSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkBatchCodec(t, data, []func() *TaskResults{
			func() *TaskResults { return new(TaskResults) },
			func() *TaskResults { return &TaskResults{WorkerID: "w0", Results: []TaskResult{{JobID: "j0"}}} },
		}, func(m *TaskResults) ([]byte, error) {
			type plain TaskResults
			return json.Marshal((*plain)(m))
		})
	})
}

// batchCodec is a batch message with a one-pass decoder and an encoder of its own.
type batchCodec[T any] interface {
	*T
	DecodeJSON([]byte) error
	MarshalJSON() ([]byte, error)
}

// checkBatchCodec holds a batch message's DecodeJSON to json.Unmarshal from each of
// starts (the same fields set, the same error), and its MarshalJSON to plain, encoding/
// json's encoding, of whatever json.Unmarshal read.
func checkBatchCodec[T any, P batchCodec[T]](t *testing.T, data []byte, starts []func() P, plain func(P) ([]byte, error)) {
	t.Helper()
	for _, start := range starts {
		want, got := start(), start()
		werr := json.Unmarshal(data, want)
		gerr := got.DecodeJSON(data)
		if errText(werr) != errText(gerr) {
			t.Fatalf("from %q: DecodeJSON error %s, json.Unmarshal %s", data, errText(gerr), errText(werr))
		}
		if !reflect.DeepEqual(want, got) {
			t.Fatalf("from %q: DecodeJSON %+v, json.Unmarshal %+v", data, got, want)
		}
	}
	m := P(new(T))
	if json.Unmarshal(data, m) != nil {
		return
	}
	want, werr := plain(m)
	got, gerr := m.MarshalJSON()
	if errText(werr) != errText(gerr) && (werr == nil || gerr == nil) {
		t.Fatalf("%+v: MarshalJSON error %v, encoding/json %v", m, gerr, werr)
	}
	if werr == nil && string(got) != string(want) {
		t.Fatalf("%+v: MarshalJSON %s, encoding/json %s", m, got, want)
	}
}

// TestResultsRoundTrip: a batch as a worker sends it is read back whole by the
// one-pass decoder.
func TestResultsRoundTrip(t *testing.T) {
	ok, boom := "ok <&>", "boom é"
	in := TaskResults{WorkerID: "w-1", Results: []TaskResult{
		{WorkerID: "w-1", JobID: "j1", AttemptID: "a1", Success: true, Result: &ok},
		{WorkerID: "w-1", JobID: "j2", AttemptID: "a2", Error: &boom, Permanent: true}, // beyond ASCII: encoding/json's
		{WorkerID: "w-1", JobID: "j3", AttemptID: "a3", SnoozeMillis: 250},
	}}
	data, err := in.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var out TaskResults
	if err := out.DecodeJSON(data); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("read back %+v from %s, want %+v", out, data, in)
	}
	if _, _, fast := scanResults(data[:0:0]); fast {
		t.Fatal("an empty input read as a batch")
	}
	ascii := TaskResults{WorkerID: "w-1", Results: in.Results[:1]}
	data, _ = ascii.MarshalJSON()
	if _, _, fast := scanResults(data); !fast {
		t.Fatalf("%s, as MarshalJSON writes it, left to encoding/json", data)
	}
}
