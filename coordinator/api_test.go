package coordinator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// TestEndpointsServeOnlyTheirOwnRequestType: each jobbus.api.* endpoint answers only its
// own request type, so NATS permissions per subject mean what the subjects say, and an
// ERROR reply carries micro's error headers with a code.
func TestEndpointsServeOnlyTheirOwnRequestType(t *testing.T) {
	t.Parallel()
	s := jobbustest.Start(t)
	tests := []struct {
		name, endpoint, body string
		wantError, wantCode  string // "" wantError: a reply of the request's own kind
	}{
		{"StatusOnStatus", "status", `{"type":"GET_JOB_STATUS","jobId":"nope"}`, "Unknown job: nope", "404"},
		{"CancelOnList", "list", `{"type":"CANCEL_JOB","jobId":"x"}`, "Unexpected message type CANCEL_JOB on jobbus.api.list", "400"},
		{"SubmitOnWorkers", "workers", `{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"a"}}`, "Unexpected message type SUBMIT_JOB on jobbus.api.workers", "400"},
		{"ListOnList", "list", `{"type":"LIST_JOBS"}`, "", ""},
		{"WorkersOnWorkers", "workers", `{"type":"LIST_WORKERS"}`, "", ""},
		{"Malformed", "submit", `{"type":`, "Malformed request: ", "400"},
		{"InvalidPayload", "submit", `{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{}}`, "Invalid payload: Field 'durationMillis' must be an integer", "400"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg, err := s.NC.Request(protocol.APIPrefix+"."+tt.endpoint, []byte(tt.body), 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			reply, err := protocol.Decode(msg.Data)
			if err != nil {
				t.Fatalf("reply %s: %v", msg.Data, err)
			}
			e, isErr := reply.(*protocol.Error)
			if tt.wantError == "" {
				if isErr || msg.Header.Get(micro.ErrorCodeHeader) != "" {
					t.Fatalf("reply %s (headers %v), want no error", msg.Data, msg.Header)
				}
				return
			}
			if !isErr || !strings.HasPrefix(e.Message, tt.wantError) {
				t.Fatalf("reply %s, want ERROR %q", msg.Data, tt.wantError)
			}
			if got := msg.Header.Get(micro.ErrorHeader); got != e.Message {
				t.Errorf("%s header %q, want the message", micro.ErrorHeader, got)
			}
			if got := msg.Header.Get(micro.ErrorCodeHeader); got != tt.wantCode {
				t.Errorf("%s header %q, want %s", micro.ErrorCodeHeader, got, tt.wantCode)
			}
		})
	}
}
