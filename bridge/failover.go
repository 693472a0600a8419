package bridge

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/natsreq"
)

// Sends of a submission, as the Go client's (client/failover.go): the first waits a
// second for its answer, each later one twice as long up to two.
const (
	submitFirstTry = time.Second
	submitMaxTry   = 2 * time.Second
)

var submitSubject = func() string { e, _ := protocol.EndpointFor(protocol.TypeSubmitJob); return e.Subject() }()

// requestRetrying forwards a request within ctx, riding out a failover, so that the
// TCP client hears one reply, only later (PROTOCOL.md: one reply per request):
//   - while nobody serves the subject (a coordinator is starting, or failing over), the
//     request is sent again; a request nobody received cannot have been acted on;
//   - an answer that its coordinator is not serving (its leader lease lapsed) is waited
//     past, and the request sent again, for the coordinator that serves;
//   - a read-only request (status, list, workers) that goes unanswered for 2 s is sent
//     again, the wait doubling, and the first reply to any send counts: a frozen
//     coordinator keeps its subscription until its server drops it;
//   - a submission gets a request id of its own (protocol.HeaderRequestID), so it is
//     sent again when a send goes unanswered for a second too: the coordinator answers
//     every send with the one job the request created.
//
// A cancel that goes unanswered is not sent again: whether it was acted on is unknown.
func (b *Bridge) requestRetrying(ctx context.Context, subject string, payload []byte) (*nats.Msg, error) {
	opts := natsreq.Options{WaitForResponders: true, Unserved: notServing}
	switch {
	case subject == submitSubject:
		opts.Fresh, opts.FirstTry, opts.MaxTry = true, submitFirstTry, submitMaxTry
		opts.Header = nats.Header{protocol.HeaderRequestID: []string{protocol.NewRequestID()}}
		opts.TryHeader = protocol.HeaderRequestTry
	case !protocol.ReadOnlySubject(subject):
		opts.Fresh, opts.FirstTry = true, b.cfg.RequestTimeout+time.Second
	}
	return natsreq.Resend(ctx, b.nc, subject, payload, opts)
}

// notServing reports an ERROR reply of a coordinator that does not serve now (micro's
// code 503), which another coordinator may serve.
func notServing(m *nats.Msg) bool {
	return m.Header.Get(micro.ErrorCodeHeader) == "503"
}
