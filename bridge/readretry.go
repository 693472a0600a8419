package bridge

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
)

// readTry is how long a forwarded read-only request (status, list, workers) waits for
// the coordinator before it is sent again, doubling with each try, within
// RequestTimeout: a frozen coordinator keeps its queue subscription until its server
// drops it, and the next try may reach the one that serves (client.ReadTry).
const readTry = time.Second

// requestRetryingReads forwards a request as requestServed does; a read-only one that
// goes unanswered for a try is sent again until ctx ends.
func (b *Bridge) requestRetryingReads(ctx context.Context, subject string, payload []byte) (*nats.Msg, error) {
	if !protocol.ReadOnlySubject(subject) {
		return b.requestServed(ctx, subject, payload)
	}
	for try := readTry; ; try *= 2 {
		tctx, cancel := context.WithTimeout(ctx, try)
		msg, err := b.requestServed(tctx, subject, payload)
		expired := tctx.Err() != nil // this try's time, not the request's, ran out
		cancel()
		if err == nil || ctx.Err() != nil || !expired {
			return msg, err
		}
		b.log.Debug("read-only request unanswered; sending it again", "subject", subject, "waited", try)
	}
}
