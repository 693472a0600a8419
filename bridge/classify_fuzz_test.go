package bridge

import (
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
)

// FuzzClassifyClient checks the client port's decision on any payload, taken as
// serveClient takes it when the coordinator vouches for nothing (a forwarded payload
// is then judged by malformed): only a decodable client request is forwarded, to its
// endpoint; anything undecodable closes the connection after a Malformed ERROR; a
// decodable non-request is answered with an ERROR that keeps the connection. Every
// ERROR fits in a frame and decodes back.
func FuzzClassifyClient(f *testing.F) {
	for _, seed := range []string{
		`{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":1},"maxAttempts":0}`,
		`{"type":"GET_JOB_STATUS","jobId":"x"}`,
		`{"type":"LIST_JOBS","limit":5,"state":"QUEUED"}`,
		`{"type":"LIST_WORKERS"}`,
		`{"type":"CANCEL_JOB","jobId":"x"}`,
		`{"type":"HEARTBEAT","workerId":"w"}`,
		`{"type":"GET_JOB_STATUS","jobId":5}`,
		`{"type":"NOPE"}`,
		`not json`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		v, subject, e := classifyClient(payload)
		if _, err := protocol.PeekType(payload); v == forward && err != nil {
			t.Fatalf("forwarded a payload without a type: %v", err)
		}
		if v == forward {
			if me := malformed(payload); me != nil {
				v, e = reject, me
			}
		}
		msg, decodeErr := protocol.Decode(payload)
		switch v {
		case forward:
			if decodeErr != nil || e != nil {
				t.Fatalf("forwarded an undecodable payload: %v", decodeErr)
			}
			e, ok := protocol.EndpointFor(msg.MessageType())
			if !ok || subject != e.Subject() {
				t.Fatalf("forwarded %s to %q", msg.MessageType(), subject)
			}
			return
		case reject:
			if decodeErr == nil || !strings.HasPrefix(e.Message, "Malformed request: ") {
				t.Fatalf("rejected a decodable payload, or with %q", e.Message)
			}
		case answer:
			if decodeErr != nil || protocol.IsClientRequest(msg.MessageType()) {
				t.Fatalf("answered %v (decode error %v)", msg, decodeErr)
			}
		default:
			t.Fatalf("verdict %v", v)
		}
		data := encodeError(e)
		if len(data) > frame.MaxSize {
			t.Fatalf("ERROR of %d bytes does not fit a frame", len(data))
		}
		back, err := protocol.DecodeAs[protocol.Error](data)
		if err != nil || back.Message != e.Message {
			t.Fatalf("ERROR %s does not decode back: %v", data, err)
		}
	})
}
