package protocol

import (
	"encoding/json"
	"reflect"
	"testing"
)

var submitJobsSeeds = []string{
	`{"type":"SUBMIT_JOBS","jobs":[{"requestId":"r1","submit":{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"a"},"maxAttempts":0,"idempotencyKey":null,"priority":null}},{"submit":{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":1}}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[]}`,
	`{"type":"SUBMIT_JOBS","jobs":null}`,
	`{"type":"SUBMIT_JOBS"}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"requestId":"","submit":{}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"requestId":"r\u00e9","submit":{}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"requestId":"r\"","submit":{}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"requestId":"` + "r\xff" + `","submit":{}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"requestId":"` + "r\t" + `","submit":{}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":null}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":"text"}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[null]}`,
	`{"type":"SUBMIT_JOBS","jobs":[1]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":{"a":}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":{"a":[1,{"b":"]}"}]}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":{ "a" : 1 }}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":{"a":"<&>"}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":{}} ,{"submit":{}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":{}},]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":{}}]} `,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":{}}]`,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":{}}],"type":"SUBMIT_JOB"}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"submit":{},"requestId":"r"}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"requestId":"r","submit":{},"submit":{"a":1}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"requestId":"r","requestId":"s","submit":{}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"REQUESTID":"r","Submit":{}}]}`,
	`{"type":"SUBMIT_JOBS","jobs":[{"requestId":1,"submit":{}}]}`,
	`{"type":"SUBMIT_JOBS","Jobs":[{"submit":{}}]}`,
	`{"jobs":[{"submit":{}}],"type":"SUBMIT_JOBS"}`,
	`null`, `[]`, `{}`, ``,
}

// FuzzSubmitJobsDecode holds SubmitJobs' scanner to json.Unmarshal: DecodeJSON and
// Decode read what it reads (the same submissions, the same error) from a zero batch
// and from one with submissions set; and MarshalJSON writes encoding/json's encoding
// of whatever was read. Seeds here and in testdata/fuzz/FuzzSubmitJobsDecode.
func FuzzSubmitJobsDecode(f *testing.F) {
	for _, s := range submitJobsSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkBatchCodec(t, data, []func() *SubmitJobs{
			func() *SubmitJobs { return new(SubmitJobs) },
			func() *SubmitJobs {
				return &SubmitJobs{Jobs: []BatchedSubmission{{RequestID: "r0", Submit: json.RawMessage(`{"a":1}`)}}}
			},
		}, func(m *SubmitJobs) ([]byte, error) {
			type plain SubmitJobs
			return encode(TypeSubmitJobs, (*plain)(m))
		})
		checkHotBatch[SubmitJobs](t, data, TypeSubmitJobs)
	})
}

// checkHotBatch checks that Decode's scanner (scanHot) takes data as a batch of type
// typ only when encoding/json reads it as one, and reads what encoding/json reads.
func checkHotBatch[T any, P interface{ *T }](t *testing.T, data []byte, typ Type) {
	t.Helper()
	m, _, ok := scanHot(data)
	if !ok {
		return
	}
	got, batch := m.(P)
	if !batch {
		return
	}
	want := P(new(T))
	read, err := PeekType(data)
	if werr := json.Unmarshal(data, want); werr != nil || err != nil || read != typ {
		t.Fatalf("from %q: scanned a batch, encoding/json reads type %q (%v), %v", data, read, err, werr)
	}
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("from %q: scanned %+v, json.Unmarshal %+v", data, got, want)
	}
}

// TestSubmitJobsScanned: a batch as a client encodes it is read by the scanner (not
// encoding/json), whole, and holds nothing of the buffer it was read from.
func TestSubmitJobsScanned(t *testing.T) {
	in := SubmitJobs{Jobs: []BatchedSubmission{
		{RequestID: "r1", Submit: json.RawMessage(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"a"}}`)},
		{Submit: json.RawMessage(`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":1}}`)},
	}}
	data, err := Encode(&in)
	if err != nil {
		t.Fatal(err)
	}
	var out SubmitJobs
	if _, ok := out.scan(data); !ok {
		t.Fatalf("%s, as Encode writes it, left to encoding/json", data)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("read back %+v from %s, want %+v", out, data, in)
	}
	for i := range data {
		data[i] = 'x'
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("%+v changed with the buffer it was read from", out)
	}
}

var jobsSubmittedSeeds = []string{
	`{"type":"JOBS_SUBMITTED","answers":[{"type":"JOB_SUBMITTED","jobId":"j1","state":"QUEUED"},{"type":"ERROR","code":503,"message":"not serving"}]}`,
	`{"type":"JOBS_SUBMITTED","answers":[]}`,
	`{"type":"JOBS_SUBMITTED","answers":null}`,
	`{"type":"JOBS_SUBMITTED"}`,
	`{"type":"JOBS_SUBMITTED","answers":[{}]}`,
	`{"type":"JOBS_SUBMITTED","answers":[null]}`,
	`{"type":"JOBS_SUBMITTED","answers":[1,"a",true]}`,
	`{"type":"JOBS_SUBMITTED","answers":[{"a":}]}`,
	`{"type":"JOBS_SUBMITTED","answers":[{"a":"]}"},{"b":[1,{"c":"x"}]}]}`,
	`{"type":"JOBS_SUBMITTED","answers":[{ "a" : 1 }]}`,
	`{"type":"JOBS_SUBMITTED","answers":[{"a":"<&>"}]}`,
	`{"type":"JOBS_SUBMITTED","answers":[{"a":"` + "\xff" + `"}]}`,
	`{"type":"JOBS_SUBMITTED","answers":[{} ,{}]}`,
	`{"type":"JOBS_SUBMITTED","answers":[{},]}`,
	`{"type":"JOBS_SUBMITTED","answers":[{}]} `,
	`{"type":"JOBS_SUBMITTED","answers":[{}]`,
	`{"type":"JOBS_SUBMITTED","answers":[{}],"type":"JOB_SUBMITTED"}`,
	`{"type":"JOBS_SUBMITTED","answers":[{}],"answers":[]}`,
	`{"type":"JOBS_SUBMITTED","Answers":[{}]}`,
	`{"answers":[{}],"type":"JOBS_SUBMITTED"}`,
	`null`, `[]`, `{}`, ``,
}

// FuzzJobsSubmittedDecode holds JobsSubmitted's scanner to json.Unmarshal, as
// FuzzSubmitJobsDecode does SubmitJobs'. Seeds here and in
// testdata/fuzz/FuzzJobsSubmittedDecode.
func FuzzJobsSubmittedDecode(f *testing.F) {
	for _, s := range jobsSubmittedSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkBatchCodec(t, data, []func() *JobsSubmitted{
			func() *JobsSubmitted { return new(JobsSubmitted) },
			func() *JobsSubmitted { return &JobsSubmitted{Answers: []json.RawMessage{json.RawMessage(`{"a":1}`)}} },
		}, func(m *JobsSubmitted) ([]byte, error) {
			type plain JobsSubmitted
			return encode(TypeJobsSubmitted, (*plain)(m))
		})
		checkHotBatch[JobsSubmitted](t, data, TypeJobsSubmitted)
	})
}

// TestJobsSubmittedScanned: a batch's answers as a coordinator encodes them are read
// by the scanner (not encoding/json), whole, and hold nothing of the buffer they were
// read from; Decode takes the same path.
func TestJobsSubmittedScanned(t *testing.T) {
	in := JobsSubmitted{Answers: []json.RawMessage{
		json.RawMessage(`{"type":"JOB_SUBMITTED","jobId":"j1","state":"QUEUED"}`),
		json.RawMessage(`{"type":"SUBMIT_REJECTED","reason":"queue full"}`),
	}}
	data, err := Encode(&in)
	if err != nil {
		t.Fatal(err)
	}
	var out JobsSubmitted
	if _, ok := out.scan(data); !ok {
		t.Fatalf("%s, as Encode writes it, left to encoding/json", data)
	}
	m, _, ok := scanHot(data)
	if !ok || !reflect.DeepEqual(m, &in) {
		t.Fatalf("Decode's scanner read %+v (ok %v) from %s, want %+v", m, ok, data, in)
	}
	for i := range data {
		data[i] = 'x'
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("%+v changed with the buffer it was read from, want %+v", out, in)
	}
}
