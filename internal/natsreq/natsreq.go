// Package natsreq sends requests to the coordinator, and sends them again where that is
// safe, for the client and the bridge alike. Request is the one statement of which
// requests are sent again and when; Resend is how; UntilServed holds any call while
// nobody serves it.
//
// NATS hands a request to one member of a queue group; a member that is frozen
// (SIGSTOP, a stalled VM) keeps its subscription until its server drops it, so the next
// send may reach one that answers; and while a coordinator fails over, nobody may serve
// for a moment, or a deposed one may answer that it does not serve while its successor
// does. A request is sent again only when that is safe: one that changes nothing, a
// submission that carries a request id (the coordinator answers a send again with the
// job the first one created), and any request nobody received.
package natsreq

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/backoff"
)

// Request sends a client API request, body to subject, and returns the reply. It is the
// one place that says which requests are sent again, and when (protocol.ReadOnly says
// which change nothing):
//   - any request nobody receives (no responders: the leader died, its successor is not
//     serving yet) is sent again, while opts.WaitForResponders or opts.Nobody says to
//     wait: nobody received it, so nobody acted on it;
//   - an answer that its coordinator is not serving (code 503: its lease lapsed; it
//     acted on nothing) is waited past, and the request sent again;
//   - a submission, or a batch of them (SUBMIT_JOBS), carries a request id
//     (protocol.HeaderRequestID; opts.RequestID, or a fresh one) and its send's number,
//     so it is sent again every SendEvery it goes
//     unanswered, and when answered "Outcome unknown" while a send's wait is left: the
//     coordinator answers every send with the one job the request created, on
//     whichever coordinator leads by then;
//   - a status or the workers, answered from memory, are sent again every SendEvery
//     they go unanswered; a list or the task types, which may take a while to build,
//     after DefaultFirstTry, then twice that; the first reply to any send counts;
//   - a cancel is never sent again once it may have been received unless answered
//     "Outcome unknown" (a cancel again changes nothing more): whether it was acted on
//     is unknown.
//
// A submission and a cancel say how long they may still wait (protocol.HeaderTimeout),
// so the coordinator answers within it; a request waiting out a failover is sent again
// at once when a new leader announces itself (protocol.LeaderSubject).
func Request(ctx context.Context, nc *nats.Conn, subject string, body []byte, opts Options) (*nats.Msg, error) {
	opts.Unserved, opts.Wake = notServing, protocol.LeaderSubject
	switch t := requestType(subject); {
	case t == protocol.TypeSubmitJob || t == protocol.TypeSubmitJobs:
		// A batch is sent again as one: its send's number tells the coordinator that
		// each of its submissions may be stored already, and each finds its job by its
		// own request id (protocol.SubmitJobs).
		rid := opts.RequestID
		if rid == "" {
			rid = protocol.NewRequestID()
		}
		opts.Fresh, opts.FirstTry, opts.MaxTry = true, SendEvery, SendEvery
		h := make(nats.Header, len(opts.Header)+2) // the caller's (a trace context), the id, the time left
		for k, v := range opts.Header {
			h[k] = v
		}
		// The id's value and the first send's time left (resend.header) share one
		// backing: a submission's header took a slice for each.
		vals := make([]string, 2)
		vals[0] = rid
		h[protocol.HeaderRequestID] = vals[0:1:1]
		opts.Header, opts.firstLeft = h, vals[1:2:2]
		opts.TryHeader, opts.TimeoutHeader = protocol.HeaderRequestTry, protocol.HeaderTimeout
		opts.Unsure = outcomeUnknown // sent again, it finds the job if it was stored
	case t == protocol.TypeGetJobStatus || t == protocol.TypeListWorkers:
		opts.FirstTry, opts.MaxTry = SendEvery, SendEvery
	case protocol.ReadOnly(t):
	case t == protocol.TypeCancelJob:
		opts.Fresh, opts.Once, opts.TimeoutHeader = true, true, protocol.HeaderTimeout
		opts.Unsure = outcomeUnknown // a cancel again changes nothing more
	case t == protocol.TypeSubmitWorkflow || t == protocol.TypeCancelWorkflow || t == protocol.TypeRetryWorkflow:
		// Never sent again once received, as any write; but they say how long they may
		// wait, for a workflow of thousands of steps takes a while to store or cancel.
		opts.Fresh, opts.Once, opts.TimeoutHeader = true, true, protocol.HeaderTimeout
	default:
		opts.Fresh, opts.Once = true, true
	}
	return Resend(ctx, nc, subject, body, opts)
}

// SendEvery is how long a submission, a status or the workers wait for a reply before
// they are sent again. A coordinator answers in milliseconds, and a send again costs it
// a lookup (no more than one a second per request while it is slow), whereas a send
// that reached a frozen leader is lost: a request that finds its leader paused reaches
// the one that takes over within SendEvery of it, or at its announcement.
const SendEvery = time.Second

// requestType is the request type the API endpoint on subject serves, "" for none.
func requestType(subject string) protocol.Type {
	t, _ := protocol.RequestOn(subject)
	return t
}

// notServing reports an ERROR reply of a coordinator that does not serve now (micro's
// code 503: its lease lapsed, and it acted on nothing), which another may serve.
func notServing(m *nats.Msg) bool {
	return m.Header.Get(micro.ErrorCodeHeader) == "503"
}

// outcomeUnknown reports an "Outcome unknown" answer: its write not confirmed in the
// time the send said it had.
func outcomeUnknown(m *nats.Msg) bool {
	return strings.HasPrefix(m.Header.Get(micro.ErrorHeader), protocol.OutcomeUnknownPrefix)
}

// untilServedRetry is how often a request nobody received is sent again.
var untilServedRetry = backoff.Policy{Base: 10 * time.Millisecond, Max: 250 * time.Millisecond}

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
	// Each later wait doubles, up to MaxTry if it is set. Once: a send that goes
	// unanswered is never sent again (it may have been acted on).
	FirstTry, MaxTry time.Duration
	Once             bool
	// RequestID is a submission's request id (Request); "" draws a fresh one. A caller
	// that sets it knows the job the submission creates (protocol.RequestJobID).
	RequestID string
	// Within bounds the whole request, from the call, when ctx has no deadline: as
	// context.WithTimeout would, without a context of its own besides each send's.
	Within time.Duration
	// Fresh sends the first send through the connection's one reply subscription, as
	// nc.Request does, and only a send again through a subscription of the call's own
	// that every later send shares: a request answered at once (nearly all) then costs
	// the server no subscription, but a reply to the first send is no longer awaited
	// once the second goes. For a request whose every send is answered alike, such as a
	// submission with a request id (its coordinator answers a send again once the
	// first's job is stored); a read whose answer is slow to build wants the first
	// reply to any send instead.
	Fresh bool
	// Header goes with every send, and TryHeader, if set, names a header that carries
	// the number of a send after the first, from 2 (a first send goes with Header as
	// it is). TimeoutHeader, if set, names a header that carries how long the request
	// may still wait, in milliseconds, so that its responder answers within it; the
	// first send sets it in Header itself, which therefore belongs to the request.
	Header        nats.Header
	TryHeader     string
	TimeoutHeader string
	// firstLeft, when Request made Header, is the one-value slice the first send's
	// TimeoutHeader value goes into (Header.Set would allocate one).
	firstLeft []string
	// WaitForResponders waits out "no responders" (with backoff, sending again) until
	// ctx ends, as a bridge holds a request while no coordinator serves. Without it,
	// "no responders" is returned at once unless a send already went unanswered (then
	// the responder that took it may be on its way out, and its successor on its way
	// in), or Nobody says to wait.
	WaitForResponders bool
	// Nobody, if set, decides at the first "no responders" that WaitForResponders does
	// not wait out: nil waits them out from then on, an error is returned.
	Nobody func(context.Context) error
	// Unserved reports a reply saying that its sender does not serve the request now (a
	// coordinator whose leader lease lapsed): it is waited past like "no responders",
	// and returned only if nothing better came before ctx ended.
	Unserved func(*nats.Msg) bool
	// Unsure reports a reply that says its request's outcome is not known yet (an
	// "Outcome unknown" of a write still going on), which a later send may hear
	// settled: it is waited past like Unserved while at least FirstTry of the request's
	// time is left, and is the answer otherwise.
	Unsure func(*nats.Msg) bool
	// Wake, if set, is a subject on which a responder announces that it now serves (a
	// new leader: protocol.LeaderSubject). Once a send went unanswered or unserved, or
	// found nobody, an announcement sends the request again at once rather than at the
	// end of its wait. Subscribed to only then, with no goroutine of its own.
	Wake string
}

// Resend sends body to subject and returns the first reply that serves it, until ctx
// ends. It returns nats.ErrNoResponders when nobody serves subject (see
// Options.WaitForResponders and Nobody), the last unserved reply if that was the last
// word, and ctx's error when sends went unanswered.
func Resend(ctx context.Context, nc *nats.Conn, subject string, body []byte, opts Options) (*nats.Msg, error) {
	r := resend{nc: nc, subject: subject, body: body, opts: opts, x: exchange{nc: nc}}
	defer r.x.close()
	return r.run(ctx)
}

// The last word on a request, which is what a request that ctx ends says.
const (
	unanswered = iota + 1 // ctx's error
	nobody                // nats.ErrNoResponders
	unserved              // the last refusal
)

// resend is one call of Resend.
type resend struct {
	nc      *nats.Conn
	subject string
	body    []byte
	opts    Options
	x       exchange
	sends   int
	last    int
	taken   bool // a send went unanswered, or its outcome unknown: a responder may have acted on it
	refusal *nats.Msg
	unsure  *nats.Msg // the last answer that its outcome is unknown (Options.Unsure)
	end     time.Time // Options.Within's end; zero: ctx's
}

func (r *resend) run(ctx context.Context) (*nats.Msg, error) {
	try := r.opts.FirstTry
	if try <= 0 {
		try = DefaultFirstTry
	}
	if _, has := ctx.Deadline(); !has && r.opts.Within > 0 {
		r.end = time.Now().Add(r.opts.Within)
	}
	if r.opts.Once {
		try = 1 << 62 // longer than any request
	}
	if err := r.send(ctx); err != nil {
		return nil, err
	}
	waitOut := r.opts.WaitForResponders
	next := time.Now().Add(try)
	for pause := untilServedRetry.Start(); ; {
		until := next
		if !r.end.IsZero() && r.end.Before(until) {
			until = r.end
		}
		m, err := r.x.wait(ctx, until)
		switch {
		case err == nil && !r.unserved(ctx, m, try):
			return m, nil
		case err == nil || errors.Is(err, nats.ErrNoResponders): // nobody serves right now
			switch {
			case err != nil:
			case r.opts.Unsure != nil && r.opts.Unsure(m):
				// Its outcome is unknown: it may have been acted on, so no later
				// refusal may be the request's last word.
				r.last, r.taken, r.unsure = unanswered, true, m
			default:
				r.last, r.refusal = unserved, m
				if r.opts.Unsure != nil {
					// A write's refusal proves only that its sender acted on nothing:
					// every coordinator subscribed gets each request (no queue group),
					// and another (the new leader, in a failover) may be storing it
					// and answer late.
					r.taken = true
				}
			}
			if err != nil {
				if !waitOut {
					if r.opts.Nobody == nil {
						return nil, nats.ErrNoResponders
					}
					if err := r.opts.Nobody(ctx); err != nil {
						return nil, err
					}
					waitOut = true
				}
				r.last = nobody
			}
			wait := pause.Next()
			if !r.end.IsZero() {
				wait = min(wait, time.Until(r.end))
			}
			r.listen()
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return r.final(ctx)
			case <-t.C:
			case <-r.x.woken:
				t.Stop()
			}
			if r.over() {
				return r.final(ctx)
			}
		case ctx.Err() != nil || r.over():
			// The time ran out on a send nobody answered: its responder may have
			// acted on it, so no earlier refusal is the request's last word.
			r.last, r.taken = unanswered, true
			return r.final(ctx)
		case errors.Is(err, errWoken): // a new responder: send again now
			r.last, r.taken, waitOut = unanswered, true, true
		case !errors.Is(err, context.DeadlineExceeded): // the connection closed, say
			if r.taken {
				return nil, ErrCutOff
			}
			return nil, err
		default: // this send went unanswered: its responder may be on its way out, and
			// its successor on its way in
			r.last, r.taken, waitOut, try = unanswered, true, true, 2*try
			if r.opts.MaxTry > 0 {
				try = min(try, r.opts.MaxTry)
			}
			r.listen()
		}
		if err := r.send(ctx); err != nil {
			return nil, err
		}
		next = time.Now().Add(try)
	}
}

// unserved reports whether reply m is to be waited past (Options.Unserved, Unsure),
// with try the wait of a send.
func (r *resend) unserved(ctx context.Context, m *nats.Msg, try time.Duration) bool {
	if r.opts.Unserved != nil && r.opts.Unserved(m) {
		return true
	}
	if r.opts.Unsure == nil || !r.opts.Unsure(m) {
		return false
	}
	end, ok := ctx.Deadline()
	if !r.end.IsZero() && (!ok || r.end.Before(end)) {
		end, ok = r.end, true
	}
	return !ok || time.Until(end) >= try
}

// listen subscribes to Options.Wake, once.
func (r *resend) listen() {
	if r.opts.Wake == "" || r.x.wake != nil {
		return
	}
	woken := make(chan *nats.Msg, 1)
	if sub, err := r.nc.ChanSubscribe(r.opts.Wake, woken); err == nil {
		r.x.wake, r.x.woken = sub, woken
	}
}

// ErrCutOff means the connection went down after a send was taken and left unanswered:
// a responder may have acted on it, and it is not sent again into nats.go's reconnect
// buffer.
var ErrCutOff = errors.New("NATS connection lost after the request was sent; no reply")

// errWoken: a wait ended by an announcement on Options.Wake.
var errWoken = errors.New("a new responder announced itself")

// over reports that the request's time (Options.Within) is up.
func (r *resend) over() bool { return !r.end.IsZero() && !time.Now().Before(r.end) }

// final is what the request says once its time is up: its last word. Nobody serving
// (nats.ErrNoResponders) and a refusal are that word only if no send was taken and left
// unanswered or answered "Outcome unknown": one that was may have been acted on, so the
// request's word is that answer, or that it went unanswered.
func (r *resend) final(ctx context.Context) (*nats.Msg, error) {
	switch {
	case r.unsure != nil: // what the request may have done, as its coordinator said it
		return r.unsure, nil
	case r.last == nobody && !r.taken:
		return nil, nats.ErrNoResponders
	case r.last == unserved && !r.taken:
		return r.refusal, nil
	}
	if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, err
	}
	if r.refusal != nil && r.opts.Unsure != nil {
		return nil, &RefusedError{Last: r.refusal}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, context.DeadlineExceeded
}

// RefusedError ends a write (a submission, a cancel) whose answers were refusals by
// coordinators that were not serving, but whose outcome is not known: every
// coordinator subscribed gets each request, and one that had not answered yet (the
// new leader, during a failover) may have acted on it. It is a
// context.DeadlineExceeded.
type RefusedError struct {
	Last *nats.Msg // the last refusal
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refused by a coordinator that was not serving (%s), and another may have taken it", e.Last.Header.Get(micro.ErrorHeader))
}

func (e *RefusedError) Unwrap() error { return context.DeadlineExceeded }

// send sends the request once more.
func (r *resend) send(ctx context.Context) error {
	if r.sends > 0 && !r.nc.IsConnected() {
		// Never into nats.go's reconnect buffer: what it holds goes out once the
		// connection is back, after this request has failed. Nothing was sent if every
		// send so far found nobody; else a responder may have acted on one.
		switch {
		case r.taken:
			return ErrCutOff
		case r.nc.IsClosed():
			return nats.ErrConnectionClosed
		}
		return nats.ErrConnectionReconnecting
	}
	if r.sends > 0 || !r.opts.Fresh {
		if err := r.x.share(); err != nil {
			return err
		}
	}
	r.sends++
	return r.x.send(&nats.Msg{Subject: r.subject, Data: r.body, Header: r.header(ctx)})
}

// header is the header of the send about to go: Header with TryHeader set to its number
// after the first and TimeoutHeader to the time left; Header itself when that is all it
// needs.
func (r *resend) header(ctx context.Context) nats.Header {
	o := &r.opts
	var v string
	if o.TryHeader != "" && r.sends > 1 {
		v = strconv.Itoa(r.sends)
	}
	var left string
	if o.TimeoutHeader != "" {
		end, ok := ctx.Deadline()
		if !r.end.IsZero() && (!ok || r.end.Before(end)) {
			end, ok = r.end, true
		}
		if ms := time.Until(end).Milliseconds(); ok && ms > 0 {
			left = strconv.FormatInt(ms, 10)
		}
	}
	switch {
	case left == "" && v == "":
		return o.Header
	case r.sends == 1: // Header is the request's own: no copy
		switch {
		case o.Header == nil:
			o.Header = make(nats.Header, 1)
		case o.firstLeft != nil:
			o.firstLeft[0] = left
			o.Header[textproto.CanonicalMIMEHeaderKey(o.TimeoutHeader)] = o.firstLeft
			return o.Header
		}
		o.Header.Set(o.TimeoutHeader, left)
		return o.Header
	}
	h := make(nats.Header, len(o.Header)+2)
	for k, v := range o.Header {
		h[k] = v
	}
	if v != "" {
		h.Set(o.TryHeader, v)
	}
	if left != "" {
		h.Set(o.TimeoutHeader, left)
	}
	return h
}

// An exchange sends a request and waits for its reply: through the connection's one
// reply subscription (as nc.Request), the request sent during wait, until share gives
// it a reply subscription of its own that every later send shares, so that a reply to
// any of them counts. An asynchronous subscription into a small channel: a synchronous
// one allocates a channel of nats.go's SubChanLen (64k entries, 512 KiB) per request,
// which 2,000 requests at once turn into a gigabyte.
type exchange struct {
	nc      *nats.Conn
	m       *nats.Msg // the request to send during wait, when not shared
	inbox   string
	replies chan *nats.Msg
	sub     *nats.Subscription
	wake    *nats.Subscription // to Options.Wake, once listened to
	woken   chan *nats.Msg     // its announcements; nil (never ready) until then
}

// share subscribes to a reply subject of the exchange's own, once.
func (x *exchange) share() error {
	if x.sub != nil {
		return nil
	}
	inbox, replies := x.nc.NewInbox(), make(chan *nats.Msg, 8)
	sub, err := x.nc.Subscribe(inbox, func(m *nats.Msg) {
		select {
		case replies <- m:
		default: // replies are waiting already: one is enough
		}
	})
	if err != nil {
		return err
	}
	x.inbox, x.replies, x.sub = inbox, replies, sub
	return nil
}

func (x *exchange) close() {
	if x.sub != nil {
		_ = x.sub.Unsubscribe()
	}
	if x.wake != nil {
		_ = x.wake.Unsubscribe()
	}
}

func (x *exchange) send(m *nats.Msg) error {
	if x.sub == nil {
		x.m = m
		return nil
	}
	x.m = nil
	m.Reply = x.inbox
	return x.nc.PublishMsg(m)
}

// wait returns a reply, nats.ErrNoResponders when nobody took the request, or the error
// of a wait that ended at until or with ctx.
func (x *exchange) wait(ctx context.Context, until time.Time) (*nats.Msg, error) {
	if x.m != nil {
		m := x.m
		x.m = nil
		if d, ok := ctx.Deadline(); ok && !d.After(until) {
			return x.nc.RequestMsgWithContext(ctx, m)
		}
		if ctx.Done() == nil {
			// Only the time can end the wait (a context.Background caller): nats.go's
			// own timer, pooled, rather than a context with a timer and a channel of
			// its own per request. As a context past its deadline, nothing is sent.
			d := time.Until(until)
			if d <= 0 {
				return nil, context.DeadlineExceeded
			}
			reply, err := x.nc.RequestMsg(m, d)
			if errors.Is(err, nats.ErrTimeout) {
				err = context.DeadlineExceeded
			}
			return reply, err
		}
		wctx, cancel := context.WithDeadline(ctx, until)
		defer cancel()
		return x.nc.RequestMsgWithContext(wctx, m)
	}
	wctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	select {
	case m := <-x.replies:
		if noResponders(m) {
			return nil, nats.ErrNoResponders
		}
		return m, nil
	case <-wctx.Done():
		return nil, wctx.Err()
	case <-x.woken:
		return nil, errWoken
	}
}

// noResponders reports whether m is the server's "503 no responders" status.
func noResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}
