package protocol_test

import (
	"encoding/json"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// The batch of submissions (a native extension) in the protocol's table tests.
func init() {
	roundTripCases = append(roundTripCases, []struct {
		name string
		msg  protocol.Message
	}{
		{"SubmitJobs", &protocol.SubmitJobs{Jobs: []protocol.BatchedSubmission{
			{RequestID: "r1", Submit: json.RawMessage(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"a"},"maxAttempts":0,"idempotencyKey":null,"priority":null}`)},
			{Submit: json.RawMessage(`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":1},"maxAttempts":2,"idempotencyKey":"k","priority":"HIGH"}`)},
		}}},
		{"JobsSubmitted", &protocol.JobsSubmitted{Answers: []json.RawMessage{
			json.RawMessage(`{"type":"JOB_SUBMITTED","jobId":"j1"}`),
			json.RawMessage(`{"type":"SUBMIT_REJECTED","reason":"full","activeCount":1,"limit":1,"retryable":true}`),
			json.RawMessage(`{"type":"ERROR","message":"Invalid taskType"}`),
		}}},
	}...)
	specFields[protocol.TypeSubmitJobs] = []string{"jobs"}
	specFields[protocol.TypeJobsSubmitted] = []string{"answers"}
}

func TestSubmitJobsEndpoint(t *testing.T) {
	t.Parallel()
	e, ok := protocol.EndpointFor(protocol.TypeSubmitJobs)
	if !ok || e.Subject() != "jobbus.api.submit.many" || protocol.ReadOnly(e.Request) {
		t.Fatalf("endpoint %+v (subject %s, read-only %v), want jobbus.api.submit.many, a write", e, e.Subject(), protocol.ReadOnly(e.Request))
	}
}

// BenchmarkDecodeSubmitJobs decodes a batch of 64 submissions as a client sends it,
// and reports the cost per submission.
func BenchmarkDecodeSubmitJobs(b *testing.B) {
	submit := json.RawMessage(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"the quick brown fox"},"maxAttempts":0,"idempotencyKey":null,"priority":null}`)
	m := protocol.SubmitJobs{Jobs: make([]protocol.BatchedSubmission, 64)}
	for i := range m.Jobs {
		m.Jobs[i] = protocol.BatchedSubmission{RequestID: protocol.NewRequestID(), Submit: submit}
	}
	data, err := protocol.Encode(&m)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := protocol.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(m.Jobs)), "ns/submission")
}

// BenchmarkEncodeJobsSubmitted encodes the answer to a batch of 64 submissions, and
// reports the cost per answer.
func BenchmarkEncodeJobsSubmitted(b *testing.B) {
	m := protocol.JobsSubmitted{Answers: make([]json.RawMessage, 64)}
	for i := range m.Answers {
		m.Answers[i], _ = protocol.Encode(&protocol.JobSubmitted{JobID: protocol.RequestJobID(protocol.NewRequestID())})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := protocol.Encode(&m); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(m.Answers)), "ns/answer")
}

// BenchmarkDecodeJobsSubmitted decodes the answer to a batch of 4 submissions (the
// bridge's batch) as a coordinator writes it, by Decode and by encoding/json, and
// reports the cost per answer.
func BenchmarkDecodeJobsSubmitted(b *testing.B) {
	m := protocol.JobsSubmitted{Answers: make([]json.RawMessage, 4)}
	for i := range m.Answers {
		m.Answers[i], _ = protocol.Encode(&protocol.JobSubmitted{JobID: protocol.RequestJobID(protocol.NewRequestID())})
	}
	data, err := protocol.Encode(&m)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		decode func([]byte) error
	}{
		{"Decode", func(d []byte) error { _, err := protocol.Decode(d); return err }},
		{"encoding/json", func(d []byte) error { return json.Unmarshal(d, new(protocol.JobsSubmitted)) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.decode(data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(m.Answers)), "ns/answer")
		})
	}
}
