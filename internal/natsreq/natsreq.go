// Package natsreq sends a NATS request again when it goes unanswered, and takes the
// first reply that serves it. NATS hands a request to one member of a queue group; a
// member that is frozen (SIGSTOP, a stalled VM) keeps its subscription until its server
// drops it, so the next send may reach one that answers; and while a coordinator fails
// over, nobody may serve for a moment, or a deposed one may answer that it does not
// serve while its successor does. Only for requests that are safe to send again: those
// that change nothing, and submissions that carry a request id (the coordinator answers
// a send again with the job the first one created).
package natsreq

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// DefaultFirstTry is how long the first send waits before the request is sent again;
// each later wait doubles. A healthy responder answers in milliseconds; a loaded one
// asked for a large list may take seconds, and every resend makes it build the answer
// again, so the first wait is not shorter. Within a 5 s request that is one resend.
const DefaultFirstTry = 2 * time.Second

// Options shape Resend.
type Options struct {
	// FirstTry is how long the first send waits for a reply; 0 means DefaultFirstTry.
	// Each later wait doubles, up to MaxTry if it is set.
	FirstTry, MaxTry time.Duration
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
	// the send's number from 1.
	Header    nats.Header
	TryHeader string
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
}

// Resend sends body to subject and returns the first reply that serves it, until ctx
// ends. It returns nats.ErrNoResponders when nobody serves subject (see
// Options.WaitForResponders and Nobody), the last unserved reply if that was the last
// word, and ctx's error when sends went unanswered.
func Resend(ctx context.Context, nc *nats.Conn, subject string, body []byte, opts Options) (*nats.Msg, error) {
	try := opts.FirstTry
	if try <= 0 {
		try = DefaultFirstTry
	}
	var x exchange = &fresh{nc: nc}
	var sh *shared
	defer func() {
		if sh != nil {
			sh.close()
		}
	}()
	sends := 0
	send := func() error {
		// Never into nats.go's reconnect buffer: what it holds goes out once the
		// connection is back, after this request has failed.
		switch {
		case sends > 0 && nc.IsClosed():
			return nats.ErrConnectionClosed
		case sends > 0 && !nc.IsConnected():
			return nats.ErrConnectionReconnecting
		}
		if sh == nil && (sends > 0 || !opts.Fresh) {
			var err error
			if sh, err = newShared(nc); err != nil {
				return err
			}
			x = sh
		}
		sends++
		m := &nats.Msg{Subject: subject, Data: body, Header: opts.header(sends)}
		return x.send(m)
	}
	if err := send(); err != nil {
		return nil, err
	}
	// last is the last word on the request, which is what a request that ctx ends says:
	// unanswered (ctx's error), nobody serving (ErrNoResponders), or unserved.
	const (
		unanswered = iota + 1
		nobody
		unserved
	)
	last, waitOut := 0, opts.WaitForResponders
	var refusal *nats.Msg
	final := func() (*nats.Msg, error) {
		switch last {
		case nobody:
			return nil, nats.ErrNoResponders
		case unserved:
			return refusal, nil
		}
		return nil, ctx.Err()
	}
	next := time.Now().Add(try)
	for pause := 10 * time.Millisecond; ; {
		m, err := x.wait(ctx, next)
		switch {
		case err == nil && (opts.Unserved == nil || !opts.Unserved(m)):
			return m, nil
		case err == nil || errors.Is(err, nats.ErrNoResponders): // nobody serves right now
			if err == nil {
				last, refusal = unserved, m
			} else {
				if !waitOut {
					if opts.Nobody == nil {
						return nil, nats.ErrNoResponders
					}
					if err := opts.Nobody(ctx); err != nil {
						return nil, err
					}
					waitOut = true
				}
				last = nobody
			}
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return final()
			case <-t.C:
			}
			pause = min(2*pause, 250*time.Millisecond)
		case ctx.Err() != nil:
			return final()
		case !errors.Is(err, context.DeadlineExceeded):
			return nil, err // the connection closed, say
		default: // this send went unanswered: its responder may be on its way out, and
			// its successor on its way in
			last, waitOut, try = unanswered, true, 2*try
			if opts.MaxTry > 0 {
				try = min(try, opts.MaxTry)
			}
		}
		if err := send(); err != nil {
			return nil, err
		}
		next = time.Now().Add(try)
	}
}

// header is the header of send n.
func (o *Options) header(n int) nats.Header {
	if o.Header == nil && o.TryHeader == "" {
		return nil
	}
	h := make(nats.Header, len(o.Header)+1)
	for k, v := range o.Header {
		h[k] = v
	}
	if o.TryHeader != "" {
		h.Set(o.TryHeader, strconv.Itoa(n))
	}
	return h
}

// An exchange sends a request and waits for its reply.
type exchange interface {
	send(m *nats.Msg) error
	// wait returns a reply, nats.ErrNoResponders when nobody took the request, or the
	// error of a wait that ended at until or with ctx.
	wait(ctx context.Context, until time.Time) (*nats.Msg, error)
}

// fresh sends each request through the connection's reply subscription, during wait.
type fresh struct {
	nc *nats.Conn
	m  *nats.Msg
}

func (f *fresh) send(m *nats.Msg) error { f.m = m; return nil }

func (f *fresh) wait(ctx context.Context, until time.Time) (*nats.Msg, error) {
	wctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	return f.nc.RequestMsgWithContext(wctx, f.m)
}

// shared sends every request with one reply subject, so a reply to any send counts.
type shared struct {
	nc      *nats.Conn
	inbox   string
	replies chan *nats.Msg
	sub     *nats.Subscription
}

// newShared subscribes to a reply subject. An asynchronous subscription into a small
// channel: a synchronous one allocates a channel of nats.go's SubChanLen (64k entries,
// 512 KiB) per request, which 2,000 requests at once turn into a gigabyte.
func newShared(nc *nats.Conn) (*shared, error) {
	s := &shared{nc: nc, inbox: nc.NewInbox(), replies: make(chan *nats.Msg, 8)}
	sub, err := nc.Subscribe(s.inbox, func(m *nats.Msg) {
		select {
		case s.replies <- m:
		default: // replies are waiting already: one is enough
		}
	})
	if err != nil {
		return nil, err
	}
	s.sub = sub
	return s, nil
}

func (s *shared) close() { _ = s.sub.Unsubscribe() }

func (s *shared) send(m *nats.Msg) error {
	m.Reply = s.inbox
	return s.nc.PublishMsg(m)
}

func (s *shared) wait(ctx context.Context, until time.Time) (*nats.Msg, error) {
	wctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	select {
	case m := <-s.replies:
		if noResponders(m) {
			return nil, nats.ErrNoResponders
		}
		return m, nil
	case <-wctx.Done():
		return nil, wctx.Err()
	}
}

// noResponders reports whether m is the server's "503 no responders" status.
func noResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}
