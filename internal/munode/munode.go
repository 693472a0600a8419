// Package munode is a small Mu node (PowerJob's Mu transport): it dials a bridge's Mu port over one
// TCP connection, registers its address with a HEARTBEAT, keeps heartbeating, serves
// asks and tells by path, and asks and tells others through the bridge. It is the
// reference node of `jobbus mu-node` and of the tests; a PowerJob worker or any
// program that writes a length and a JSON object does the same.
package munode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/bus/protocol/mu"
)

// Errors callers match with errors.Is.
var (
	// ErrClosed: the node's connection is closed; asks waiting fail with it at once.
	ErrClosed = errors.New("munode: connection closed")
	// ErrRemote: the answer was an ERROR; the error is a *RemoteError.
	ErrRemote = errors.New("munode: remote error")
)

// RemoteError is an ERROR answer.
type RemoteError struct{ Message string }

func (e *RemoteError) Error() string        { return e.Message }
func (e *RemoteError) Is(target error) bool { return target == ErrRemote }

// HandlerFunc serves a message sent to a path: for an ASK, the payload returned is the
// RESPONSE's and an error is the ERROR's text.
type HandlerFunc func(ctx context.Context, m *mu.Message) (json.RawMessage, error)

// Echo answers with the payload it was sent.
func Echo(_ context.Context, m *mu.Message) (json.RawMessage, error) { return m.Payload, nil }

// Options configure a node.
type Options struct {
	// Heartbeat is how often the node sends HEARTBEAT (default 5s; the bridge closes a
	// connection silent for its idle timeout, 30s by default).
	Heartbeat time.Duration
	// Timeout bounds Dial's registration and every write (default 10s).
	Timeout time.Duration
	// Logger receives what the node says; nil discards it.
	Logger *slog.Logger
}

// Node is a Mu node on one connection. It is safe for concurrent use.
type Node struct {
	conn net.Conn
	self mu.Address
	opts Options
	log  *slog.Logger

	ctx    context.Context // ends on Close or when the connection ends
	cancel context.CancelFunc
	wg     sync.WaitGroup // read loop, heartbeat loop, handlers

	wmu sync.Mutex // one frame at a time

	mu       sync.Mutex // guards the fields below
	pending  map[string]chan *mu.Message
	next     uint64
	handlers map[string]HandlerFunc
	err      error // why the connection ended
}

// Dial connects to the Mu port at addr as self, registers, and returns once the bridge
// confirmed the registration (a HEARTBEAT with a requestId, which it answers), so that
// the bus reaches the node from then on.
func Dial(ctx context.Context, addr string, self mu.Address, opts Options) (*Node, error) {
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = 5 * time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("munode: dial %s: %w", addr, err)
	}
	n := &Node{conn: c, self: self, opts: opts, log: opts.Logger.With("mu", self.String()),
		pending: make(map[string]chan *mu.Message), handlers: make(map[string]HandlerFunc)}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.wg.Add(1)
	go n.readLoop()
	rctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	if _, err := n.roundTrip(rctx, &mu.Message{MessageType: mu.TypeHeartbeat, SenderAddress: &n.self}); err != nil {
		_ = n.Close()
		return nil, fmt.Errorf("munode: register %s: %w", self, err)
	}
	n.wg.Add(1)
	go n.heartbeatLoop()
	return n, nil
}

// Self is the node's address.
func (n *Node) Self() mu.Address { return n.self }

// Handle serves path (exactly as the bus sends it, without any "@..."); fn runs on a
// goroutine of its own per message. A panic in fn is logged and answers an ASK with
// an ERROR.
func (n *Node) Handle(path string, fn HandlerFunc) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.handlers[path] = fn
}

// Ask sends an ASK to path ("<path>@<destination>", or a jobbus.api subject) and waits
// for its RESPONSE payload, or for ctx. An ERROR answer is a *RemoteError.
func (n *Node) Ask(ctx context.Context, path string, payload json.RawMessage) (json.RawMessage, error) {
	return n.roundTrip(ctx, &mu.Message{MessageType: mu.TypeAsk, Path: path, SenderAddress: &n.self, Payload: payload})
}

// Tell sends a TELL to path.
func (n *Node) Tell(path string, payload json.RawMessage) error {
	return n.write(&mu.Message{MessageType: mu.TypeTell, Path: path, SenderAddress: &n.self, Payload: payload})
}

// roundTrip sends m with a fresh requestId and waits for the answer with it.
func (n *Node) roundTrip(ctx context.Context, m *mu.Message) (json.RawMessage, error) {
	n.mu.Lock()
	if n.err != nil {
		err := n.err
		n.mu.Unlock()
		return nil, err
	}
	n.next++
	id := n.self.String() + "-" + strconv.FormatUint(n.next, 36)
	ch := make(chan *mu.Message, 1)
	n.pending[id] = ch
	n.mu.Unlock()
	m.RequestID = id
	if err := n.write(m); err != nil {
		n.drop(id)
		return nil, err
	}
	select {
	case a, ok := <-ch:
		if !ok {
			return nil, n.Err()
		}
		return answer(a)
	case <-ctx.Done():
		if !n.drop(id) {
			if a, ok := <-ch; ok {
				return answer(a)
			}
			return nil, n.Err()
		}
		return nil, fmt.Errorf("munode: ask %s: %w", m.Path, ctx.Err())
	}
}

func answer(a *mu.Message) (json.RawMessage, error) {
	if a.MessageType == mu.TypeError {
		return nil, &RemoteError{Message: a.ErrorMessage}
	}
	return a.Payload, nil
}

// drop forgets a pending ask; false if its answer (or the end) came first.
func (n *Node) drop(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.pending[id]
	delete(n.pending, id)
	return ok
}

func (n *Node) write(m *mu.Message) error {
	data, err := mu.Encode(m)
	if err != nil {
		return err
	}
	n.wmu.Lock()
	defer n.wmu.Unlock()
	if err := n.conn.SetWriteDeadline(time.Now().Add(n.opts.Timeout)); err != nil {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	if err := frame.Write(n.conn, data); err != nil {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return nil
}

func (n *Node) heartbeatLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.opts.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			if err := n.write(&mu.Message{MessageType: mu.TypeHeartbeat, SenderAddress: &n.self}); err != nil {
				n.log.Debug("heartbeat not sent", "err", err)
			}
		}
	}
}

// readLoop reads until the connection ends, then fails every ask waiting.
func (n *Node) readLoop() {
	defer n.wg.Done()
	r := frame.NewReader(n.conn)
	var err error
	for {
		var data []byte
		if data, err = r.Read(); err != nil {
			break
		}
		var m *mu.Message
		if m, err = mu.Decode(data); err != nil {
			break
		}
		n.dispatch(m)
	}
	n.end(err)
}

func (n *Node) end(cause error) {
	n.mu.Lock()
	if n.err == nil {
		n.err = fmt.Errorf("%w: %w", ErrClosed, cause)
	}
	pending := n.pending
	n.pending = map[string]chan *mu.Message{}
	n.mu.Unlock()
	for _, ch := range pending {
		close(ch)
	}
	n.cancel()
	_ = n.conn.Close()
}

func (n *Node) dispatch(m *mu.Message) {
	switch m.MessageType {
	case mu.TypeResponse, mu.TypeError:
		n.mu.Lock()
		ch := n.pending[m.RequestID]
		delete(n.pending, m.RequestID)
		n.mu.Unlock()
		if ch != nil {
			ch <- m
			return
		}
		if m.MessageType == mu.TypeError {
			n.log.Warn("ERROR from the bridge", "path", m.Path, "request", m.RequestID, "err", m.ErrorMessage)
		}
	case mu.TypeAsk, mu.TypeTell:
		n.mu.Lock()
		fn := n.handlers[m.Path]
		n.mu.Unlock()
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.serve(fn, m)
		}()
	}
}

func (n *Node) serve(fn HandlerFunc, m *mu.Message) {
	var payload json.RawMessage
	var err error
	if fn == nil {
		err = fmt.Errorf("no handler for path %q on %s", m.Path, n.self)
	} else {
		payload, err = n.call(fn, m)
	}
	n.log.Debug("served", "type", m.MessageType, "path", m.Path, "err", err)
	if m.MessageType != mu.TypeAsk {
		return
	}
	a := &mu.Message{MessageType: mu.TypeResponse, RequestID: m.RequestID, Path: m.Path, SenderAddress: &n.self, Payload: payload}
	if err != nil {
		a = &mu.Message{MessageType: mu.TypeError, RequestID: m.RequestID, Path: m.Path, SenderAddress: &n.self, ErrorMessage: err.Error()}
	}
	if werr := n.write(a); werr != nil {
		n.log.Debug("answer not sent", "err", werr)
	}
}

// call runs the handler, turning a panic into its error and a log line with the stack,
// as the bus does for its handlers: one bad message costs its own ask, not the process.
func (n *Node) call(fn HandlerFunc, m *mu.Message) (payload json.RawMessage, err error) {
	defer func() {
		if r := recover(); r != nil {
			n.log.Error("mu handler panicked", "type", m.MessageType, "path", m.Path,
				"panic", r, "stack", string(debug.Stack()))
			payload, err = nil, fmt.Errorf("handler %s panicked: %v", m.Path, r)
		}
	}()
	return fn(n.ctx, m)
}

// Done is closed when the connection has ended.
func (n *Node) Done() <-chan struct{} { return n.ctx.Done() }

// Err is why the connection ended, nil while it is up.
func (n *Node) Err() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.err
}

// Close closes the connection and waits for the node's goroutines. It is idempotent.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.err == nil {
		n.err = ErrClosed
	}
	n.mu.Unlock()
	_ = n.conn.Close()
	n.wg.Wait()
	return nil
}
