package client

import (
	"context"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/natsreq"
)

// request sends a client API request over NATS. A read-only one (protocol.ReadOnly:
// status, list, workers) that goes unanswered for 2 s is sent again, the wait
// doubling, and the first reply to any send counts (internal/natsreq): a frozen
// coordinator (SIGSTOP, a stalled VM) keeps its queue subscription until its server drops
// it, and the next send may reach the one that serves. Submissions and cancels are sent
// once: whether an unanswered one was acted on is unknown.
func request(ctx context.Context, nc *nats.Conn, t protocol.Type, subject string, body []byte) (*nats.Msg, error) {
	if !protocol.ReadOnly(t) {
		return nc.RequestMsgWithContext(ctx, natsreq.Request(ctx, subject, body))
	}
	return natsreq.Resend(ctx, nc, subject, body, natsreq.Options{})
}
