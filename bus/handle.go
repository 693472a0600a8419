package bus

import (
	"context"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// HandlerFunc serves the messages sent to a path. For an ask, its reply (encoded like
// a message, see Ask) or its error is the answer; for a tell both are ignored, an error
// is only counted and logged. Handlers run concurrently, up to the node's WithMaxInFlight
// (a path's OwnSlots, for its own); ctx ends when the node closes.
type HandlerFunc func(ctx context.Context, req *Request) (reply any, err error)

// Handle serves path on the node's own subject and, with AsRole or OnlyRole, on its
// role's subject in the role's queue group. A path has one handler per node. When the
// connection is up, Handle returns once the server knows the subscriptions, so the
// handler serves messages that other connections send from then on.
func (n *Node) Handle(path string, fn HandlerFunc, opts ...HandleOption) error {
	if err := validPath(path); err != nil {
		return err
	}
	hc := handleConfig{direct: true}
	for _, o := range opts {
		o(&hc)
	}
	if hc.ownSlots < 0 {
		return fmt.Errorf("handle %s: own slots must not be negative, got %d", path, hc.ownSlots)
	}
	if err := n.subscribe(path, fn, hc); err != nil {
		return err
	}
	n.sync()
	return nil
}

func (n *Node) subscribe(path string, fn HandlerFunc, hc handleConfig) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.handlers == nil:
		return fmt.Errorf("handle %s: %w", path, ErrClosed)
	case n.handlers[path] != nil:
		return fmt.Errorf("handle %s: %w", path, ErrHandled)
	}
	h := &handling{stop: make(chan struct{}), slots: n.slots}
	if hc.ownSlots > 0 {
		h.slots = make(chan struct{}, hc.ownSlots)
		n.ownSlots = append(n.ownSlots, h.slots)
	}
	cb := func(m *nats.Msg) { n.dispatch(path, fn, m, h) }
	var subs []*nats.Subscription
	if hc.direct {
		s, err := n.nc.Subscribe(subject(n.self, anySender, path), cb)
		if err != nil {
			return fmt.Errorf("handle %s: %w", path, err)
		}
		subs = append(subs, s)
	}
	if hc.role {
		s, err := n.nc.QueueSubscribe(subject(Address{Role: n.self.Role}, anySender, path), string(n.self.Role), cb)
		if err != nil {
			_ = unsubscribe(subs...)
			return fmt.Errorf("handle %s as role: %w", path, err)
		}
		subs = append(subs, s)
	}
	h.subs = subs
	n.handlers[path] = h
	return nil
}

// handling is what serves one path (or HandleAny's): its subscriptions, stop, which
// Unhandle closes so that the messages they still deliver are refused, and the slots
// its handlers take (the node's, or its own: OwnSlots).
type handling struct {
	subs  []*nats.Subscription
	stop  chan struct{}
	slots chan struct{}
}

// Handle serves path with a typed function: the request's payload is decoded into Req
// (a decoding failure is the answer, as an error), and the Resp returned is the answer.
func Handle[Req, Resp any](n *Node, path string, fn func(ctx context.Context, from Address, req Req) (Resp, error), opts ...HandleOption) error {
	return n.Handle(path, func(ctx context.Context, r *Request) (any, error) {
		var req Req
		if err := r.Decode(&req); err != nil {
			return nil, Errorf(CodeBadRequest, "decode %s request: %w", r.Path, err)
		}
		return fn(ctx, r.From, req)
	}, opts...)
}

// Unhandle stops serving path; handlers already running finish, and asks that reached
// the node but wait for a handler are answered with an ERROR of CodeUnavailable.
// Unhandling a path that has no handler does nothing.
func (n *Node) Unhandle(path string) error {
	n.mu.Lock()
	h := n.handlers[path]
	delete(n.handlers, path)
	n.mu.Unlock()
	var err error
	if h != nil {
		close(h.stop)
		err = n.drain(h.subs...)
	}
	n.sync()
	return err
}

// sync waits until the server has seen the node's subscription changes, so that a
// handler serves (or no longer serves) messages from other connections as soon as
// Handle (or Unhandle) returns. A connection that is down sends them when it is back.
func (n *Node) sync() {
	if !n.nc.IsConnected() {
		return
	}
	if err := n.nc.FlushTimeout(n.cfg.askTimeout); err != nil {
		n.log.Debug("bus flush", "err", err)
	}
}

// handlerIdle is how long a handler goroutine waits for another message before it
// exits. Goroutines are reused because a fresh one starts with a small stack that is
// copied, larger, as JSON decoding deepens it: in bench profiles that copying cost
// about 7% of the CPU.
const handlerIdle = time.Second

// handlerCall is one message for a handler, and the slots it holds one of.
type handlerCall struct {
	path  string
	fn    HandlerFunc
	m     *nats.Msg
	slots chan struct{}
}

// dispatch runs on a subscription's delivery goroutine: it waits for a free slot, so a
// flood queues in the subscription's bounded buffer instead of in goroutines, and
// serves the message on a goroutine of its own: an idle one if there is one, else a
// new one, so that at most as many exist as slots. It refuses the message once the
// node closes or h stops (Unhandle).
func (n *Node) dispatch(path string, fn HandlerFunc, m *nats.Msg, h *handling) {
	select {
	case <-h.stop: // a free slot must not win over Unhandle
		n.refuse(path, m)
		return
	case h.slots <- struct{}{}:
	case <-n.ctx.Done():
		n.refuse(path, m)
		return
	}
	if n.ctx.Err() != nil || stopped(h.stop) { // the slot raced Close's or Unhandle's
		<-h.slots
		n.refuse(path, m)
		return
	}
	call := handlerCall{path: path, fn: fn, m: m, slots: h.slots}
	select {
	case n.handoff <- call:
	default:
		n.pool.Add(1)
		go n.handlerLoop(call)
	}
}

func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// refuse answers a message that reached the node as it closes or stops serving path:
// an ask gets ERROR CodeUnavailable at once, so that its asker does not wait out its
// timeout for a handler that will never run, and may ask again elsewhere.
func (n *Node) refuse(path string, m *nats.Msg) {
	n.stats.dropped.Add(1)
	if m.Reply == "" {
		return
	}
	err := Errorf(CodeUnavailable, "%s: %w", n.self, ErrClosed)
	if n.ctx.Err() == nil {
		err = Errorf(CodeUnavailable, "%s no longer serves %s", n.self, path)
	}
	if perr := n.respondError(m.Reply, first(m.Header[HeaderRequestID]), err); perr != nil {
		n.log.Debug("bus refusal not sent", "path", path, "err", perr)
	}
}

// handlerLoop serves call, then whatever dispatch hands it, until it has been idle for
// handlerIdle or the node closes.
func (n *Node) handlerLoop(call handlerCall) {
	defer n.pool.Done()
	var idle *time.Timer
	for {
		n.serve(call)
		if idle == nil {
			idle = time.NewTimer(handlerIdle)
			defer idle.Stop()
		} else {
			idle.Reset(handlerIdle)
		}
		select {
		case call = <-n.handoff:
		case <-idle.C:
			return
		case <-n.ctx.Done():
			return
		}
	}
}

func (n *Node) serve(call handlerCall) {
	path, fn, m := call.path, call.fn, call.m
	defer func() { <-call.slots }()
	req, err := parseRequest(m, path)
	if err == nil && req.Kind != KindTell && req.Kind != KindAsk {
		err = fmt.Errorf("unexpected %s %s", HeaderKind, req.Kind)
	}
	if req != nil {
		n.stats.countRecv(req.Kind, len(m.Data))
	}
	if err != nil {
		n.stats.dropped.Add(1)
		n.log.Debug("bus dropped message", "path", path, "subject", m.Subject, "err", err)
		n.respond(m.Reply, req, nil, fmt.Errorf("bus: %w", err))
		return
	}
	reply, err := n.call(fn, req)
	if err != nil {
		n.stats.handlerErrs.Add(1)
		n.log.Debug("bus handler failed", "path", path, "from", req.From.String(), "kind", req.Kind, "err", err)
	}
	if req.Kind == KindAsk {
		n.respond(m.Reply, req, reply, err)
	}
}

// call runs the handler, turning a panic into an error (and a log line with the stack).
func (n *Node) call(fn HandlerFunc, req *Request) (reply any, err error) {
	defer func() {
		if r := recover(); r != nil {
			n.stats.handlerPncs.Add(1)
			n.log.Error("bus handler panicked", "path", req.Path, "from", req.From.String(),
				"panic", r, "stack", string(debug.Stack()))
			reply, err = nil, fmt.Errorf("handler %s panicked: %v", req.Path, r)
		}
	}()
	return fn(n.ctx, req)
}

// respond answers an ask: RESPONSE with the encoded reply, or ERROR with err's text.
func (n *Node) respond(to string, req *Request, reply any, err error) {
	if to == "" {
		return
	}
	var data []byte
	if err == nil {
		if data, err = marshal(reply); err != nil {
			err = fmt.Errorf("encode %s answer: %w", req.Path, err)
		}
	}
	// The asker knows whom it asked and what: an answer carries only kind and request
	// id, and an ERROR its code.
	var perr error
	if err != nil {
		perr = n.respondError(to, req.ID, err)
	} else {
		perr = n.publishFrom(to, "", KindResponse, req.ID, "", "", data)
	}
	if perr != nil {
		n.log.Debug("bus answer not sent", "path", req.Path, "err", perr)
	}
}

// respondError sends an ERROR answer: err's text, and its code in a header. Errors are
// rare, so this message is built afresh rather than pooled.
func (n *Node) respondError(to, id string, err error) error {
	m := &nats.Msg{Subject: to, Data: []byte(err.Error()), Header: nats.Header{}}
	m.Header.Set(HeaderKind, string(KindError))
	m.Header.Set(HeaderErrorCode, strconv.Itoa(int(codeOf(err))))
	if id != "" {
		m.Header.Set(HeaderRequestID, id)
	}
	if perr := n.nc.PublishMsg(m); perr != nil {
		return n.sendError(perr)
	}
	n.stats.countSent(KindError, len(m.Data))
	return nil
}
