package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// hotDecoder is one hot message type's fast decoder, and json.Unmarshal's reading of
// the same type (the types have no UnmarshalJSON, so that is the reflective decoding
// the fast one must equal). start is a message with every non-pointer field set, so
// that a frame without them must leave them as they were.
type hotDecoder struct {
	name  string
	fresh func() any // a pointer to a zero message
	start func() any // a pointer to a message with its plain fields set
}

var hotDecoders = []hotDecoder{
	{"TaskAssign", func() any { return new(TaskAssign) },
		func() any { return &TaskAssign{JobID: "j", AttemptID: "a", AttemptNumber: 7, TaskType: "t"} }},
	{"TaskResult", func() any { return new(TaskResult) },
		func() any {
			return &TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Success: true, Permanent: true}
		}},
	{"ResultAck", func() any { return new(ResultAck) }, func() any { return &ResultAck{JobID: "j", Accepted: true} }},
	{"SubmitJob", func() any { return new(SubmitJob) }, func() any { return &SubmitJob{TaskType: "t", MaxAttempts: 3} }},
	{"JobSubmitted", func() any { return new(JobSubmitted) }, func() any { return &JobSubmitted{JobID: "j"} }},
}

var hotSeeds = []string{
	`{"type":"TASK_ASSIGN","jobId":"7f3c2a9e","attemptId":"0b8e6f4d","attemptNumber":1,"taskType":"SHA256","payload":{"text":"a b <c>","n":[1,-2.5e3,true,null,{}]}}`,
	`{"type":"TASK_RESULT","workerId":"w-1","jobId":"j","attemptId":"a","success":true,"result":"{\"words\":3}","error":null}`,
	`{"type":"TASK_RESULT","workerId":"w-1","jobId":"j","attemptId":"a","success":false,"result":null,"error":"boom","permanent":true}`,
	`{"jobId":"j","accepted":true}`,
	`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"ms":5},"maxAttempts":3,"idempotencyKey":"k","priority":"HIGH"}`,
	`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":null,"maxAttempts":0,"idempotencyKey":null,"priority":null}`,
	`{"type":"JOB_SUBMITTED","jobId":"j"}`,
	` { "jobId" : "j" , "attemptNumber" : -0 } `,
	`{"jobId":"a\"b\u00e9","workerId":"\ud83d\ude00"}`,
	`{"JOBID":"x","Success":true}`,
	"{\"ta\u017fkType\":\"x\",\"attemptId\":\"\u212a\"}",
	`{"attemptNumber":"1"}`, `{"attemptNumber":1.5}`, `{"attemptNumber":1e3}`, `{"maxAttempts":99999999999999999999}`,
	`{"attemptNumber":01}`, `{"attemptNumber":-}`, `{"success":"true"}`, `{"result":1}`,
	`{"jobId":"a","jobId":"b","result":"x","result":null,"error":null,"error":"y"}`,
	`{"jobId":"j"} x`, `{"jobId":"j",}`, `{"jobId" "j"}`, `{"jobId":"j"`, `null`, `[]`, `{}`, ``, `"s"`,
	"{\"jobId\":\"\xff\xfe\"}", "{\"jobId\":\"a\tb\"}", `{"jobId":"a\x"}`, `{"jobId":"\u12"}`,
	`{"priority":"high"}`, `{"priority":1}`, `{"priority":"LOW","priority":null}`,
	`{"payload":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`,
	`{"payload":{"a":"\u2028","b":"` + "\u2029" + `"},"type":"X","extra":[1,{"x":null}]}`,
	`{"payload": { "a" : 1 } }`, `{"payload":[1,]}`, `{"payload":tru}`, `{"payload":-01}`, `{"payload":1.}`, `{"payload":2e}`,
	// As Encode writes them (exact), and near misses.
	`{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":0,"taskType":"T","payload":null}`,
	`{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"T","payload":["\u003c",{"k":"v\"w"}]}`,
	`{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":false,"result":null,"error":"say \"hi\" \u003cb\u003e\n","permanent":true}`,
	`{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":true,"result":"\/\u003C","error":null,"permanent":false}`,
	`{"type":"JOB_SUBMITTED","jobId":"j","jobId":"k"}`, `{"jobId":"j","accepted":false}`,
	`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"maxAttempts":0,"idempotencyKey":null,"priority":null,"queue":"q","concurrencyKey":"k"}`,
	`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"maxAttempts":0,"idempotencyKey":null,"priority":null,"concurrencyKey":"k"}`,
	`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"maxAttempts":0,"idempotencyKey":null,"priority":null,"queue":""}`,
	`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"maxAttempts":0,"idempotencyKey":null,"priority":null,"queue":null,"concurrencyKey":"k"}`,
	`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"maxAttempts":0,"idempotencyKey":null,"priority":null,"queue":"q","runInMillis":5}`,
}

// FuzzHotDecode holds each hot message's scanner to encoding/json: DecodeJSON reads
// what json.Unmarshal reads, with the same error, from a zero message and from one
// whose fields are set; and what the scanner calls exact, encoding/json writes back
// byte for byte from the message read (Encode for a message, json.Marshal for a
// ResultAck). Seeds here and in testdata/fuzz/FuzzHotDecode.
func FuzzHotDecode(f *testing.F) {
	for _, s := range hotSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, d := range hotDecoders {
			for _, start := range []func() any{d.fresh, d.start} {
				want, got := start(), start()
				werr := json.Unmarshal(data, want)
				gerr := got.(interface{ DecodeJSON([]byte) error }).DecodeJSON(data)
				if errText(werr) != errText(gerr) {
					t.Fatalf("%s from %q: DecodeJSON error %s, json.Unmarshal %s", d.name, data, errText(gerr), errText(werr))
				}
				if !reflect.DeepEqual(want, got) {
					t.Fatalf("%s from %q: DecodeJSON %+v, json.Unmarshal %+v", d.name, data, got, want)
				}
				checkScanExact(t, d.name, start(), data)
			}
		}
	})
}

// checkScanExact fails t when m's scanner calls data exact but encoding/json writes
// the message it read otherwise.
func checkScanExact(t *testing.T, name string, m any, data []byte) {
	t.Helper()
	exact, ok := m.(interface{ scan([]byte) (bool, bool) }).scan(data)
	if !exact {
		return
	}
	if !ok {
		t.Fatalf("%s from %q: exact, but left to encoding/json", name, data)
	}
	var again []byte
	var err error
	if msg, isMsg := m.(Message); isMsg {
		again, err = Encode(msg)
	} else {
		again, err = json.Marshal(m)
	}
	if err != nil || !bytes.Equal(again, data) {
		t.Fatalf("%s from %q: exact, but encoding/json writes %q (%v)", name, data, again, err)
	}
}

// TestScanResultAck: the scanner calls a ResultAck exact as json.Marshal writes it,
// and nothing else.
func TestScanResultAck(t *testing.T) {
	for _, tt := range []struct {
		data  string
		exact bool
	}{
		{`{"jobId":"j-1","accepted":true}`, true},
		{`{"jobId":"j-1","accepted":false}`, true},
		{`{"jobId":"j-1","accepted":true} `, false},
		{`{"accepted":true,"jobId":"j-1"}`, false},
		{`{"jobId":"j\u002d1","accepted":true}`, false},
		{`{"jobId":"j-1","accepted":1}`, false},
		{`{"jobId":"j-1"}`, false},
	} {
		var ack ResultAck
		if exact, _ := ack.scan([]byte(tt.data)); exact != tt.exact {
			t.Errorf("scan(%s) exact = %v, want %v", tt.data, exact, tt.exact)
		}
		checkScanExact(t, "ResultAck", new(ResultAck), []byte(tt.data))
	}
}

func errText(err error) string {
	if err == nil {
		return "none"
	}
	return fmt.Sprintf("%T %q", err, err)
}

// FuzzHotEncode holds each hot message's MarshalJSON, and Record's AppendJSON, to
// encoding/json's encoding (marshalSlow, json.Marshal): the same bytes, the same
// error, for whatever json.Unmarshal reads from the input, and with the input itself
// as payload and as strings.
// Seeds here and in testdata/fuzz/FuzzHotEncode.
func FuzzHotEncode(f *testing.F) {
	for _, s := range hotSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := string(data)
		p := Priority(s)
		msgs := []interface {
			MarshalJSON() ([]byte, error)
			marshalSlow() ([]byte, error)
		}{
			TaskAssign{JobID: s, AttemptID: "a", AttemptNumber: -len(s), TaskType: s, Payload: data},
			TaskResult{WorkerID: s, Result: &s, Error: &s, Permanent: len(s)%2 == 0, SnoozeMillis: int64(len(s) % 3)},
			SubmitJob{TaskType: s, Payload: data, MaxAttempts: len(s), IdempotencyKey: &s, Priority: &p},
			SubmitJob{TaskType: s, Payload: data, Queue: s, RunInMillis: int64(len(s))},
			SubmitJob{TaskType: s, Payload: data, Queue: s, ConcurrencyKey: s},
			SubmitJob{TaskType: s, Payload: data, MaxAttempts: len(s), ConcurrencyKey: s, Priority: &p},
			JobSubmitted{JobID: s},
			JobsSubmitted{Answers: []json.RawMessage{data}},
			JobsSubmitted{Answers: []json.RawMessage{json.RawMessage(`{"type":"JOB_SUBMITTED","jobId":"j"}`), data, nil}},
			JobsSubmitted{Answers: []json.RawMessage{}},
			JobsSubmitted{},
			SubmitJobs{Jobs: []BatchedSubmission{{RequestID: s, Submit: data}}},
			SubmitJobs{Jobs: []BatchedSubmission{{Submit: json.RawMessage(`{"type":"SUBMIT_JOB","taskType":"T"}`)}, {RequestID: "r", Submit: data}, {}}},
			SubmitJobs{Jobs: []BatchedSubmission{}},
			SubmitJobs{},
		}
		res := "r"
		recs := []Record{{JobID: s, TaskType: "t", Payload: data, State: State(s), Attempts: len(s), Seq: uint64(len(s)) << 40,
			Result: &res, CreatedAt: -1, IdempotencyKey: s, Fingerprint: s}, {WorkerID: s, LastWorkerID: s, Error: &s, EndedAt: 1, RetryAt: 2}, {LastWorkerID: s},
			{Queue: s, RunAt: 3, Snoozes: len(s), Schedule: s, ConcurrencyKey: s, UniqueKey: s, UniqueUntil: 4, AfterAnyEnd: len(s)%2 == 1,
				WorkflowID: s, Step: s, BatchID: s, TraceParent: s, TraceState: s, ProgressMessage: s},
			{After: []string{s}, Progress: new(float64)}}
		var rec Record
		if json.Unmarshal(data, &rec) == nil {
			recs = append(recs, rec)
		}
		for _, r := range recs {
			got, gerr := r.AppendJSON([]byte("x"))
			want, werr := json.Marshal(r)
			if werr == nil {
				want = append([]byte("x"), want...)
			}
			if gerr != nil {
				got = nil
			}
			if errText(gerr) != errText(werr) || !bytes.Equal(got, want) {
				t.Fatalf("%#v:\nAppendJSON %s %s\njson.Marshal %s %s", r, got, errText(gerr), want, errText(werr))
			}
		}
		var ta TaskAssign
		if json.Unmarshal(data, &ta) == nil {
			msgs = append(msgs, ta)
		}
		var tr TaskResult
		if json.Unmarshal(data, &tr) == nil {
			msgs = append(msgs, tr)
		}
		var sj SubmitJob
		if json.Unmarshal(data, &sj) == nil {
			msgs = append(msgs, sj)
		}
		var js JobSubmitted
		if json.Unmarshal(data, &js) == nil {
			msgs = append(msgs, js)
		}
		for _, m := range msgs {
			got, gerr := m.MarshalJSON()
			want, werr := m.marshalSlow()
			if errText(gerr) != errText(werr) || !bytes.Equal(got, want) {
				t.Fatalf("%#v:\nMarshalJSON %s %s\nencoding/json %s %s", m, got, errText(gerr), want, errText(werr))
			}
		}
	})
}

// The benchmarks set each fast codec against encoding/json's for a frame of the
// benchmark's size.
var (
	benchAssign = []byte(`{"type":"TASK_ASSIGN","jobId":"7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a69","attemptId":"0b8e6f4d-2c3a-4e1f-8d7c-6b5a49382716","attemptNumber":1,"taskType":"SHA256","payload":{"text":"job 12345 of the benchmark, a hundred bytes of text or so to hash, as bench submits"}}`)
	benchResult = []byte(`{"type":"TASK_RESULT","workerId":"worker-1","jobId":"7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a69","attemptId":"0b8e6f4d-2c3a-4e1f-8d7c-6b5a49382716","success":true,"result":"{\"sha256\":\"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"}","error":null}`)
	benchSubmit = []byte(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"job 12345 of the benchmark, a hundred bytes of text or so to hash, as bench submits"},"maxAttempts":3,"idempotencyKey":null,"priority":null}`)
)

func BenchmarkHotDecode(b *testing.B) {
	for _, c := range []struct {
		name string
		data []byte
		msg  func() any
	}{
		{"TaskAssign", benchAssign, func() any { return new(TaskAssign) }},
		{"TaskResult", benchResult, func() any { return new(TaskResult) }},
		{"SubmitJob", benchSubmit, func() any { return new(SubmitJob) }},
	} {
		b.Run(c.name+"/fast", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.msg().(interface{ DecodeJSON([]byte) error }).DecodeJSON(c.data); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/encoding_json", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := json.Unmarshal(c.data, c.msg()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkHotEncode(b *testing.B) {
	var ta TaskAssign
	var tr TaskResult
	var sj SubmitJob
	for _, err := range []error{json.Unmarshal(benchAssign, &ta), json.Unmarshal(benchResult, &tr), json.Unmarshal(benchSubmit, &sj)} {
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		msg  interface {
			MarshalJSON() ([]byte, error)
			marshalSlow() ([]byte, error)
		}
	}{{"TaskAssign", ta}, {"TaskResult", tr}, {"SubmitJob", sj}} {
		b.Run(c.name+"/fast", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.msg.MarshalJSON(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/encoding_json", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.msg.marshalSlow(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRecord sets Record's AppendJSON against json.Marshal(&rec), the
// coordinator's call today.
func BenchmarkRecord(b *testing.B) {
	res := `{"sha256":"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}`
	rec := Record{JobID: "7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a69", TaskType: "SHA256",
		Payload: json.RawMessage(`{"text":"job 12345 of the benchmark, a hundred bytes of text or so to hash, as bench submits"}`),
		State:   StateCompleted, Attempts: 1, MaxAttempts: 3, Priority: PriorityNormal, Seq: 12345, Result: &res,
		CreatedAt: 1764547200000, UpdatedAt: 1764547200005, EndedAt: 1764547200005}
	b.Run("AppendJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := rec.AppendJSON(nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(&rec); err != nil {
				b.Fatal(err)
			}
		}
	})
}
