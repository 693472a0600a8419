package bridge

import (
	"context"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/natsreq"
)

// requestRetryingReads forwards a request as requestServed does. A read-only one
// (status, list, workers) that goes unanswered for 2 s is sent again, the wait
// doubling within RequestTimeout, and the first reply to any send counts
// (internal/natsreq): a frozen coordinator keeps its queue subscription until its
// server drops it, and the next send may reach the one that serves.
func (b *Bridge) requestRetryingReads(ctx context.Context, subject string, payload []byte) (*nats.Msg, error) {
	if !protocol.ReadOnlySubject(subject) {
		return b.requestServed(ctx, subject, payload)
	}
	return natsreq.Resend(ctx, b.nc, subject, payload, natsreq.Options{WaitForResponders: true})
}
