package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/natsreq"
)

// FailoverNotice is what a request says while it waits for a coordinator to take over
// (WithFailoverNotice).
const FailoverNotice = "no coordinator is serving right now (a failover takes about the leader lease); retrying"

// A submission that goes unanswered for submitTry is sent again, every submitTry. A
// coordinator answers in milliseconds, and a send again costs it a lookup (and no more
// than one a second per request while it is slow), whereas a send that reached a frozen
// leader (SIGSTOP, a stalled VM) is lost: within a 5 s request, a submission that
// finds its leader paused reaches the one that takes over within a second of it.
const submitTry = time.Second

// presenceWait bounds the question whether any coordinator process runs, asked when none
// serves the API: each answers at once.
const presenceWait = 500 * time.Millisecond

// WithFailoverNotice has the client call notice with FailoverNotice when a request finds
// no coordinator serving while a coordinator process runs (a standby about to take over,
// or a leader still recovering): the request then waits for one to serve, until its
// deadline, instead of failing at once. At most once per request.
func WithFailoverNotice(notice func(msg string)) Option {
	return func(c *Client) { c.notice = notice }
}

// request sends a client API request over NATS and rides out a failover within ctx:
//   - a request nobody receives (no responders: the leader died, its successor is not
//     serving yet) is sent again while a coordinator process runs, and fails at once
//     while none does (jobbus is not running there);
//   - an answer that its coordinator is not serving (its leader lease lapsed) is waited
//     past, and the request sent again, for the coordinator that serves;
//   - a read-only request (protocol.ReadOnly) that goes unanswered is sent again, and
//     the first reply to any send counts: a frozen coordinator keeps its subscription
//     until its server drops it. A status or the workers, answered from memory, are
//     sent every second; a list, which may take a while to build, after 2 s, then 4;
//   - a submission carries a request id (protocol.HeaderRequestID), so it is sent again
//     every second it goes unanswered too: the coordinator answers each send with the
//     one job the request created, on whichever coordinator leads by then.
//
// A submission or a cancel answered "Outcome unknown" is sent again too, and says how
// long it may still wait (protocol.HeaderTimeout). A request sent again for going
// unanswered, or waiting for a coordinator to serve, is sent again at once when a new
// leader announces itself (protocol.LeaderSubject). A cancel that goes unanswered is
// not sent again: whether it was acted on is unknown.
func (n *natsTransport) request(ctx context.Context, t protocol.Type, subject string, body []byte, within time.Duration) (*nats.Msg, error) {
	opts := natsreq.Options{Within: within, Unserved: notServing, Nobody: n.nobodyFn, Wake: protocol.LeaderSubject}
	var rid string
	switch {
	case t == protocol.TypeSubmitJob:
		rid = protocol.NewRequestID()
		opts.Fresh, opts.FirstTry, opts.MaxTry = true, submitTry, submitTry
		opts.Header = nats.Header{protocol.HeaderRequestID: {rid}, protocol.HeaderRequestTry: firstTry}
		opts.TryHeader, opts.TimeoutHeader = protocol.HeaderRequestTry, protocol.HeaderTimeout
		opts.Unsure = outcomeUnknown // sent again, it finds the job if it was stored
	case t == protocol.TypeGetJobStatus || t == protocol.TypeListWorkers:
		// Answered from memory: sent again as soon as a submission.
		opts.FirstTry, opts.MaxTry = submitTry, submitTry
	case t == protocol.TypeCancelJob:
		opts.Fresh, opts.FirstTry, opts.TimeoutHeader = true, untilDeadline(ctx, within), protocol.HeaderTimeout
		opts.Unsure = outcomeUnknown // a cancel again changes nothing more
	case !protocol.ReadOnly(t):
		opts.Fresh, opts.FirstTry = true, untilDeadline(ctx, within)
	}
	msg, err := natsreq.Resend(ctx, n.nc, subject, body, opts)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		// A coordinator process ran, but none served in time: nothing was received.
		err = fmt.Errorf("%w on %s: %s, but none took over in time", ErrNoCoordinator, n.nc.ConnectedUrlRedacted(), noticeWithoutRetrying)
	case rid != "" && context.Cause(ctx) == ctx.Err() && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, natsreq.ErrCutOff)):
		// A send was taken and not answered: the job its request id names may exist.
		cause := "no reply from a coordinator in time"
		if errors.Is(err, natsreq.ErrCutOff) {
			cause = err.Error()
		}
		err = &ServerError{Message: protocol.OutcomeUnknown("submission", protocol.RequestJobID(rid), cause).Message}
	}
	return msg, err
}

// firstTry is the HeaderRequestTry of a first send, shared by every request.
var firstTry = []string{protocol.TryValue(1)}

// nobody decides, when no coordinator serves, whether to wait for one: while a
// coordinator process runs (a failover), not otherwise.
func (n *natsTransport) nobody(ctx context.Context) error {
	if !n.coordinatorRuns(ctx) {
		return fmt.Errorf("%w on %s (is `jobbus serve` running?)", ErrNoCoordinator, n.nc.ConnectedUrlRedacted())
	}
	if n.notice != nil {
		n.notice(FailoverNotice)
	}
	return nil
}

var noticeWithoutRetrying = FailoverNotice[:len(FailoverNotice)-len("; retrying")]

// untilDeadline is a first try that outlasts ctx: the request is never sent again for
// going unanswered.
func untilDeadline(ctx context.Context, within time.Duration) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d) + time.Second
	}
	if within > 0 {
		return within + time.Second
	}
	return 1 << 62
}

// notServing reports an ERROR reply of a coordinator that does not serve now (micro's
// code 503: its lease lapsed, or it cannot tell yet whether a request was acted on),
// which another coordinator may serve.
func notServing(m *nats.Msg) bool {
	return m.Header.Get(micro.ErrorCodeHeader) == "503"
}

// outcomeUnknown reports an "Outcome unknown" answer: its write not confirmed in the
// time the send said it had. A submission under its request id, or a cancel, is safe to
// send again, and a later send may hear it settled (by then, or by the next leader).
func outcomeUnknown(m *nats.Msg) bool {
	return strings.HasPrefix(m.Header.Get(micro.ErrorHeader), protocol.OutcomeUnknownPrefix)
}

// coordinatorRuns reports whether a coordinator process answers presence
// (protocol.CoordinatorsSubject): a standby, or a leader that is not serving yet.
func (n *natsTransport) coordinatorRuns(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, presenceWait)
	defer cancel()
	_, err := n.nc.RequestWithContext(ctx, protocol.CoordinatorsSubject, nil)
	return err == nil
}
