package protocol

import "encoding/json"

// Submissions in batches, a native extension of the client port (PROTOCOL.md
// "Submissions in batches"; spec peers never send it): a client sends several
// submissions in one SubmitJobs (the Go client's SubmitMany) and hears one
// JobsSubmitted with each submission's own answer.
const (
	TypeSubmitJobs    Type = "SUBMIT_JOBS"
	TypeJobsSubmitted Type = "JOBS_SUBMITTED"
)

// MaxSubmissions is the most submissions a coordinator takes in one SubmitJobs; it
// refuses a larger batch whole (an ERROR naming the limit).
const MaxSubmissions = 256

// SubmitJobs carries several submissions in one request (jobbus.api.submit.many).
// Each is served exactly as if it had come alone on jobbus.api.submit, with the batch
// request's headers (its due time, its send count) and its own request id.
type SubmitJobs struct {
	Jobs []BatchedSubmission `json:"jobs"`
}

// BatchedSubmission is one submission of a SubmitJobs: the SUBMIT_JOB request as a
// client would send it alone (a whole message, type included), and the request id it
// would carry in protocol.HeaderRequestID ("": none). The job it creates is
// RequestJobID(RequestID), so a batch sent again finds each of its jobs as a single
// submission sent again does.
type BatchedSubmission struct {
	RequestID string          `json:"requestId,omitempty"`
	Submit    json.RawMessage `json:"submit"`
}

// JobsSubmitted answers a SubmitJobs once every submission in it is answered:
// Answers[i] is the reply Jobs[i] would have got alone (JOB_SUBMITTED, SUBMIT_REJECTED
// or ERROR), byte for byte, so a bridge can forward it to a TCP client unchanged. An
// ERROR instead of a JobsSubmitted answers every submission of the batch (it was not
// served: malformed, too large, or the coordinator was not serving).
type JobsSubmitted struct {
	Answers []json.RawMessage `json:"answers"`
}

func (SubmitJobs) MessageType() Type    { return TypeSubmitJobs }
func (JobsSubmitted) MessageType() Type { return TypeJobsSubmitted }

func (m SubmitJobs) MarshalJSON() ([]byte, error) {
	if b, ok := m.appendFast(); ok { // submitcodec.go
		return b, nil
	}
	return m.marshalSlow()
}

func (m JobsSubmitted) MarshalJSON() ([]byte, error) {
	if b, ok := m.appendFast(); ok { // submitcodec.go
		return b, nil
	}
	return m.marshalSlow()
}
