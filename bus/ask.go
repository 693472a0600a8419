package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// pendingAsk is an ask waiting for its answer. Whoever removes it from Node.pending
// (the answer, a disconnect, Close) sends exactly one askResult on ch, which has room
// for it; so the asker can always reuse ch once it has removed the ask itself or
// received that one result.
type pendingAsk struct {
	ch chan askResult
	// to is whom the ask went to: one node, whose leave fails the ask (peerLeft), or
	// any node of a role (no ID), which nobody can tell has gone.
	to Address
}

type askResult struct {
	msg *nats.Msg
	err error
}

// Tell sends msg to path at to, without waiting for anything: a tell to a node that is
// not there is lost, as NATS drops messages nobody subscribes to. While the connection
// is reconnecting, tells wait in its bounded buffer.
func (n *Node) Tell(ctx context.Context, to Address, path string, msg any) error {
	if err := n.checkSend(ctx, to, path); err != nil {
		return fmt.Errorf("tell %s %s: %w", to, path, err)
	}
	data, err := marshal(msg)
	if err != nil {
		return fmt.Errorf("tell %s %s: encode: %w", to, path, err)
	}
	if err := n.publish(subject(to, n.sendAs, path), "", KindTell, "", path, data); err != nil {
		return fmt.Errorf("tell %s %s: %w", to, path, err)
	}
	return nil
}

func (n *Node) checkSend(ctx context.Context, to Address, path string) error {
	if n.ctx.Err() != nil {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := to.Validate(); err != nil {
		return err
	}
	return validPath(path)
}

// Ask sends req to path at to and waits for the answer, decoded into R: JSON, except
// that a []byte or json.RawMessage R receives the payload itself, a *R that is a
// Decoder decodes it itself, and an empty answer leaves R's zero value. The wait ends with ctx, or after the node's ask timeout when
// ctx has no deadline.
//
// Errors: a *RemoteError (errors.Is ErrRemote) when the handler failed; ErrNoPeer at
// once when nobody serves the path at to; ErrTimeout (wrapping the context's error);
// ErrDisconnected when the connection is down or goes down while waiting; ErrClosed;
// CodeUnavailable (not ErrRemote) as soon as presence watched on n (WatchPresence) sees
// to, one node, leave while the ask waits: NATS says nothing when a node that took an
// ask dies, and the answer will not come. The node may have acted on the ask.
func Ask[R any](ctx context.Context, n *Node, to Address, path string, req any) (R, error) {
	var r R
	data, err := n.ask(ctx, to, path, req)
	if err != nil {
		return r, err
	}
	if err := decode(data, &r); err != nil {
		return r, fmt.Errorf("ask %s %s: decode answer: %w", to, path, err)
	}
	return r, nil
}

// ask does an Ask's round trip and returns the answer's payload.
func (n *Node) ask(ctx context.Context, to Address, path string, req any) ([]byte, error) {
	start := time.Now()
	data, err := n.sendAsk(ctx, to, path, req, start)
	if err != nil {
		var re *RemoteError
		switch {
		case errors.As(err, &re):
			return nil, err
		case errors.Is(err, ErrNoPeer):
			n.stats.asks[askNoPeer].Add(1)
		case errors.Is(err, ErrTimeout):
			n.stats.asks[askTimeout].Add(1)
		case errors.Is(err, ErrDisconnected):
			n.stats.asks[askDisconnected].Add(1)
		default:
			n.stats.asks[askFailed].Add(1)
		}
		return nil, fmt.Errorf("ask %s %s: %w", to, path, err)
	}
	return data, nil
}

func (n *Node) sendAsk(ctx context.Context, to Address, path string, req any, start time.Time) ([]byte, error) {
	if err := n.checkSend(ctx, to, path); err != nil {
		return nil, err
	}
	data, err := marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	p := n.pendPool.Get().(*pendingAsk)
	p.to = to
	id, err := n.register(p)
	if err != nil {
		n.pendPool.Put(p)
		return nil, err
	}
	reply := n.replySubject(id)
	if err := n.publish(subject(to, n.sendAs, path), reply, KindAsk, reply[len(n.inbox)+1:], path, data); err != nil {
		n.abandon(id, p)
		n.pendPool.Put(p)
		return nil, err
	}
	res := n.wait(ctx, id, p)
	n.pendPool.Put(p)
	if res.err != nil {
		return nil, res.err
	}
	return n.answer(res.msg, path, start)
}

// register adds p to the pending asks. It checks the connection after adding, so a
// disconnect either comes before (and the ask fails now) or after (and its status event
// fails the ask): no ask is left waiting for an answer that cannot come.
func (n *Node) register(p *pendingAsk) (uint64, error) {
	n.pendMu.Lock()
	if n.closed {
		n.pendMu.Unlock()
		return 0, ErrClosed
	}
	n.nextID++
	id := n.nextID
	n.pending[id] = p
	n.pendMu.Unlock()
	if !n.nc.IsConnected() {
		if res := n.abandon(id, p); res.err != nil {
			return 0, res.err
		}
		return 0, ErrDisconnected
	}
	return id, nil
}

// abandon removes an ask that is no longer waited for. When someone removed it first,
// their result is already on its way, and abandon returns it.
func (n *Node) abandon(id uint64, p *pendingAsk) askResult {
	n.pendMu.Lock()
	_, mine := n.pending[id]
	delete(n.pending, id)
	n.pendMu.Unlock()
	if mine {
		return askResult{}
	}
	return <-p.ch
}

// wait waits for the answer to ask id, for ctx and, without a ctx deadline, for the
// node's ask timeout.
func (n *Node) wait(ctx context.Context, id uint64, p *pendingAsk) askResult {
	var t *time.Timer
	var expired <-chan time.Time
	if _, ok := ctx.Deadline(); !ok {
		t = n.timer(n.cfg.askTimeout)
		expired = t.C
		defer n.putTimer(t)
	}
	var cause error
	select {
	case res := <-p.ch:
		return res
	case <-ctx.Done():
		cause = ctx.Err()
	case <-expired:
		cause = fmt.Errorf("no answer in %v: %w", n.cfg.askTimeout, context.DeadlineExceeded)
	}
	if res := n.abandon(id, p); res.msg != nil || res.err != nil {
		return res // the answer raced the timeout: take it
	}
	return askResult{err: fmt.Errorf("%w: %w", ErrTimeout, cause)}
}

// answer interprets an answer: no responders, ERROR or RESPONSE.
func (n *Node) answer(m *nats.Msg, path string, start time.Time) ([]byte, error) {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return nil, ErrNoPeer
	}
	kind := Kind(first(m.Header[HeaderKind]))
	if kind == "" { // Envelope2's RESPONSE, or a plain NATS responder's answer
		kind = KindResponse
	}
	n.stats.countRecv(kind, len(m.Data))
	n.stats.observe(time.Since(start))
	if kind == KindError {
		n.stats.asks[askRemoteError].Add(1)
		code := CodeInternal
		if c, err := strconv.Atoi(m.Header.Get(HeaderErrorCode)); err == nil {
			code = Code(c)
		}
		return nil, &RemoteError{Path: path, Code: code, Message: string(m.Data)}
	}
	n.stats.asks[askOK].Add(1)
	return m.Data, nil
}

// onAnswer receives every answer to the node's asks (the mux subscription) and hands it
// to its asker. Late answers, whose asker gave up, are dropped.
func (n *Node) onAnswer(m *nats.Msg) {
	if len(m.Subject) <= len(n.inbox)+1 {
		return
	}
	id, err := strconv.ParseUint(m.Subject[len(n.inbox)+1:], 36, 64)
	if err != nil {
		return
	}
	n.pendMu.Lock()
	p := n.pending[id]
	delete(n.pending, id)
	n.pendMu.Unlock()
	if p != nil {
		p.ch <- askResult{msg: m}
	}
}

// failPending ends every waiting ask with err; closing also refuses new asks.
func (n *Node) failPending(err error, closing bool) {
	n.pendMu.Lock()
	if closing {
		n.closed = true
	}
	failed := n.pending
	if len(failed) > 0 {
		n.pending = make(map[uint64]*pendingAsk)
	} else {
		failed = nil // the empty map stays in use: ranging over it unlocked would race
	}
	n.pendMu.Unlock()
	for _, p := range failed {
		p.ch <- askResult{err: err}
	}
}

// peerLeft fails the asks waiting for node a, which presence saw leave (its goodbye, or
// no heartbeat within the watcher's timeout), so that they do not wait out their
// timeout for an answer that will not come. Asks to a's role are left alone: another
// node of the role may have taken them. The asks fail behind every message the
// connection has received (a Barrier), so that an answer a node sent before its goodbye
// is taken, not lost; a subscription whose delivery is held up delays them, at worst
// to their timeout as before.
func (n *Node) peerLeft(a Address) {
	if !n.waitsFor(a) {
		return
	}
	fail := func() { n.failPendingTo(a) }
	if err := n.nc.Barrier(fail); err != nil {
		fail() // the connection is closed: nothing more will arrive
	}
}

// waitsFor reports whether an ask to node a is waiting.
func (n *Node) waitsFor(a Address) bool {
	n.pendMu.Lock()
	defer n.pendMu.Unlock()
	for _, p := range n.pending {
		if p.to == a {
			return true
		}
	}
	return false
}

// failPendingTo ends the asks waiting for node a with CodeUnavailable. It removes them
// all before it ends any.
func (n *Node) failPendingTo(a Address) {
	var gone []*pendingAsk
	n.pendMu.Lock()
	for id, p := range n.pending {
		if p.to == a {
			delete(n.pending, id)
			gone = append(gone, p)
		}
	}
	n.pendMu.Unlock()
	if len(gone) == 0 {
		return
	}
	err := Errorf(CodeUnavailable, "%s left before it answered", a)
	for _, p := range gone {
		p.ch <- askResult{err: err}
	}
}

// replySubject is "<inbox>.<id base 36>"; the part after the inbox is the request id.
func (n *Node) replySubject(id uint64) string {
	var buf [96]byte
	b := append(buf[:0], n.inbox...)
	b = append(b, '.')
	b = strconv.AppendUint(b, id, 36)
	return string(b)
}
