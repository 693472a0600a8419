package client

import (
	"context"
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
// for a try is sent again (protocol.ReadOnly). Submissions and cancels are sent once.
func request(ctx context.Context, nc *nats.Conn, t protocol.Type, subject string, body []byte) (*nats.Msg, error) {
	if !protocol.ReadOnly(t) {
		return nc.RequestWithContext(ctx, subject, body)
	}
	for try := ReadTry; ; try *= 2 {
		tctx, cancel := context.WithTimeout(ctx, try)
		msg, err := nc.RequestWithContext(tctx, subject, body)
		expired := tctx.Err() != nil // this try's time, not the request's, ran out
		cancel()
		if err == nil || ctx.Err() != nil || !expired {
			return msg, err
		}
	}
}
