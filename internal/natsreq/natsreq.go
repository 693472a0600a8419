// Package natsreq sends requests to the coordinator again when that is safe, for the
// client and the bridge alike: a read-only request when it goes unanswered (Resend),
// and any request while nobody serves its subject (UntilServed). Request says which
// is which, once.
//
// NATS hands a request to one member of a queue group; a member that is frozen
// (SIGSTOP, a stalled VM) keeps its subscription until its server drops it, so the
// next send may reach one that answers. Every send shares one reply subject, so a slow
// answer to an early send still counts: a resend never makes a slow reply arrive later.
package natsreq

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/backoff"
)

// untilServedRetry is how often a request nobody received is sent again.
var untilServedRetry = backoff.Policy{Base: 10 * time.Millisecond, Max: 250 * time.Millisecond}

// Request sends a client API request, body to subject, and returns the reply. It is
// the one place that says which requests are sent again: a read-only one
// (protocol.ReadOnlySubject: status, list, workers) whenever it goes unanswered
// (Resend); a submission or a cancel only while nobody serves subject, with
// opts.WaitForResponders (a request nobody received cannot have been acted on), and
// never once it may have been received: whether it was acted on is unknown.
func Request(ctx context.Context, nc *nats.Conn, subject string, body []byte, opts Options) (*nats.Msg, error) {
	if protocol.ReadOnlySubject(subject) {
		return Resend(ctx, nc, subject, body, opts)
	}
	if !opts.WaitForResponders {
		return nc.RequestMsgWithContext(ctx, Msg(ctx, subject, body))
	}
	first := true
	return UntilServed(ctx, func(err error) bool { return errors.Is(err, nats.ErrNoResponders) }, func() (*nats.Msg, error) {
		if !first && !nc.IsConnected() {
			return nil, nats.ErrConnectionReconnecting
		}
		first = false
		return nc.RequestMsgWithContext(ctx, Msg(ctx, subject, body))
	})
}

// UntilServed calls ask until it fails otherwise than unserved says (nobody serves
// the request: a coordinator is starting, or failing over), asking again after 10 ms,
// doubling to 250 ms, until ctx ends. An ask nobody received cannot have been acted
// on, so asking again is safe. When the time runs out while asking again, the error is
// the last unserved one, not the timeout.
func UntilServed[T any](ctx context.Context, unserved func(error) bool, ask func() (T, error)) (T, error) {
	var none T
	var last error
	for b := untilServedRetry.Start(); ; {
		v, err := ask()
		switch {
		case err != nil && unserved(err):
			last = err
		case err != nil && last != nil && ctx.Err() != nil:
			return none, last
		default:
			return v, err
		}
		if !b.Wait(ctx) {
			return none, last
		}
	}
}

// DefaultFirstTry is how long the first send waits before the request is sent again;
// each later wait doubles. A healthy responder answers in milliseconds; a loaded one
// asked for a large list may take seconds, and every resend makes it build the answer
// again, so the first wait is not shorter. Within a 5 s request that is one resend.
const DefaultFirstTry = 2 * time.Second

// Options shape Resend.
type Options struct {
	// FirstTry is how long the first send waits for a reply; 0 means DefaultFirstTry.
	FirstTry time.Duration
	// WaitForResponders waits out "no responders" (with backoff, sending again) until
	// ctx ends, as a bridge holds a request while no coordinator serves. Without it,
	// "no responders" is returned at once unless a send already went unanswered (then
	// the responder that took it may be on its way out, and its successor on its way in).
	WaitForResponders bool
}

// Resend sends body to subject and returns the first reply to any send, until ctx ends.
// It returns nats.ErrNoResponders when nobody serves subject (see
// Options.WaitForResponders), and ctx's error when sends went unanswered.
func Resend(ctx context.Context, nc *nats.Conn, subject string, body []byte, opts Options) (*nats.Msg, error) {
	try := opts.FirstTry
	if try <= 0 {
		try = DefaultFirstTry
	}
	// An asynchronous subscription into a small channel: a synchronous one allocates a
	// channel of nats.go's SubChanLen (64k entries, 512 KiB) per request, which 2,000
	// requests at once turn into a gigabyte.
	inbox := nc.NewInbox()
	replies := make(chan *nats.Msg, 4)
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		select {
		case replies <- m:
		default: // a reply is waiting already: one is enough
		}
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	send := func() error { return nc.PublishMsg(&nats.Msg{Subject: subject, Reply: inbox, Data: body}) }
	if err := send(); err != nil {
		return nil, err
	}
	// nobody: the last word was "no responders", so a request still unanswered when
	// ctx ends most likely found nobody again.
	unanswered, nobody := false, false
	next := time.Now().Add(try)
	for pause := untilServedRetry.Start(); ; {
		wctx, cancel := context.WithDeadline(ctx, next)
		var m *nats.Msg
		select {
		case m = <-replies:
			err = nil
		case <-wctx.Done():
			err = wctx.Err()
		}
		cancel()
		switch {
		case err == nil && !noResponders(m):
			return m, nil
		case err == nil: // nobody serves subject right now
			nobody = true
			if !opts.WaitForResponders && !unanswered {
				return nil, nats.ErrNoResponders
			}
			if !pause.Wait(ctx) {
				return nil, nats.ErrNoResponders
			}
		case ctx.Err() != nil && nobody:
			return nil, nats.ErrNoResponders
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case !errors.Is(err, context.DeadlineExceeded):
			return nil, err // the connection closed, say
		default: // this send went unanswered
			unanswered, nobody, try = true, false, 2*try
		}
		if err := send(); err != nil {
			return nil, err
		}
		next = time.Now().Add(try)
	}
}

// noResponders reports whether m is the server's "503 no responders" status.
func noResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}

// Msg is a request message of body to subject that says, in
// protocol.HeaderTimeout, how long ctx lets its sender wait for the reply: the
// coordinator answers a submission or a cancel within it, "Outcome unknown" if its
// write is not confirmed by then.
func Msg(ctx context.Context, subject string, body []byte) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = body
	if d, ok := ctx.Deadline(); ok {
		if left := time.Until(d); left > 0 {
			m.Header.Set(protocol.HeaderTimeout, strconv.FormatInt(left.Milliseconds(), 10))
		}
	}
	return m
}
