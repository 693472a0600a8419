package bridge

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/natsreq"
)

// A submission, a status or the workers that go unanswered are sent again every
// submitTry, as the Go client does (client/failover.go).
const submitTry = time.Second

var submitSubject, cancelSubject, statusSubject, workersSubject = subjectOf(protocol.TypeSubmitJob), subjectOf(protocol.TypeCancelJob),
	subjectOf(protocol.TypeGetJobStatus), subjectOf(protocol.TypeListWorkers)

func subjectOf(t protocol.Type) string {
	e, _ := protocol.EndpointFor(t)
	return e.Subject()
}

// requestRetrying forwards a request within ctx, riding out a failover, so that the
// TCP client hears one reply, only later (PROTOCOL.md: one reply per request):
//   - while nobody serves the subject (a coordinator is starting, or failing over), the
//     request is sent again; a request nobody received cannot have been acted on;
//   - an answer that its coordinator is not serving (its leader lease lapsed) is waited
//     past, and the request sent again, for the coordinator that serves;
//   - a read-only request (status, list, workers) that goes unanswered is sent again,
//     and the first reply to any send counts: a frozen coordinator keeps its
//     subscription until its server drops it. A status or the workers are sent every
//     second; a list, which may take a while to build, after 2 s, then 4;
//   - a submission gets a request id of its own (protocol.HeaderRequestID), so it is
//     sent again every second it goes unanswered too: the coordinator answers
//     every send with the one job the request created.
//
// A submission or a cancel answered "Outcome unknown" is sent again too, and says how
// long it may still wait (protocol.HeaderTimeout). A request sent again for going
// unanswered, or waiting for a coordinator to serve, is sent again at once when a new
// leader announces itself (protocol.LeaderSubject). A cancel that goes unanswered is
// not sent again: whether it was acted on is unknown. jobID is the job a submission
// creates if it is stored, for an answer that its outcome is unknown.
func (b *Bridge) requestRetrying(ctx context.Context, subject string, payload []byte) (msg *nats.Msg, jobID string, err error) {
	opts := natsreq.Options{WaitForResponders: true, Unserved: notServing, Wake: protocol.LeaderSubject}
	switch {
	case subject == statusSubject || subject == workersSubject:
		// Answered from memory: sent again as soon as a submission.
		opts.FirstTry, opts.MaxTry = submitTry, submitTry
	case subject == submitSubject:
		rid := protocol.NewRequestID()
		jobID = protocol.RequestJobID(rid) // the job it creates, if it is stored
		opts.Fresh, opts.FirstTry, opts.MaxTry = true, submitTry, submitTry
		opts.Header = nats.Header{protocol.HeaderRequestID: []string{rid}}
		opts.TryHeader, opts.TimeoutHeader = protocol.HeaderRequestTry, protocol.HeaderTimeout
		opts.Unsure = outcomeUnknown // sent again, it finds the job if it was stored
	case subject == cancelSubject:
		opts.Fresh, opts.FirstTry, opts.TimeoutHeader = true, b.cfg.RequestTimeout+time.Second, protocol.HeaderTimeout
		opts.Unsure = outcomeUnknown // a cancel again changes nothing more
	case !protocol.ReadOnlySubject(subject):
		opts.Fresh, opts.FirstTry = true, b.cfg.RequestTimeout+time.Second
	}
	msg, err = natsreq.Resend(ctx, b.nc, subject, payload, opts)
	return msg, jobID, err
}

// notServing reports an ERROR reply of a coordinator that does not serve now (micro's
// code 503), which another coordinator may serve.
func notServing(m *nats.Msg) bool {
	return m.Header.Get(micro.ErrorCodeHeader) == "503"
}

// outcomeUnknown reports an "Outcome unknown" answer: its write not confirmed in the
// time the send said it had. A submission under its request id, or a cancel, is safe to
// send again, and a later send may hear it settled (by then, or by the next leader).
func outcomeUnknown(m *nats.Msg) bool {
	return strings.HasPrefix(m.Header.Get(micro.ErrorHeader), protocol.OutcomeUnknownPrefix)
}
