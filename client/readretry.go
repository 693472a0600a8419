package client

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
)

// ReadTry is how long a read-only request (status, list, workers) waits for an answer
// before it is sent again, doubling with each try, until the request's own deadline.
// NATS hands a request to one member of the coordinators' queue group; one that is
// frozen (SIGSTOP, a stalled VM) keeps its subscription until its server drops it
// (seconds with jobbus's ping settings, minutes with NATS's defaults), so the next try
// may reach the coordinator that serves. A healthy coordinator answers in milliseconds.
const ReadTry = time.Second

// request sends a client API request over NATS; a read-only one that goes unanswered
// for a try is sent again (protocol.ReadOnly), and once one went unanswered, a moment
// with no coordinator at all (the frozen one dropped, its successor not yet serving) is
// waited out too. Submissions and cancels are sent once.
func request(ctx context.Context, nc *nats.Conn, t protocol.Type, subject string, body []byte) (*nats.Msg, error) {
	if !protocol.ReadOnly(t) {
		return nc.RequestWithContext(ctx, subject, body)
	}
	unanswered := false
	for try, pause := ReadTry, 10*time.Millisecond; ; {
		tctx, cancel := context.WithTimeout(ctx, try)
		msg, err := nc.RequestWithContext(tctx, subject, body)
		expired := tctx.Err() != nil // this try's time, not the request's, ran out
		cancel()
		switch {
		case err == nil || ctx.Err() != nil:
			return msg, err
		case expired:
			unanswered, try = true, 2*try
		case unanswered && errors.Is(err, nats.ErrNoResponders):
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, err
			case <-t.C:
			}
			pause = min(2*pause, 250*time.Millisecond)
		default:
			return msg, err
		}
	}
}
