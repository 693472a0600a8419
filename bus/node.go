// Package bus is jobbus's message layer: PowerJob's Mu transport (TELL, ASK,
// RESPONSE, ERROR, HEARTBEAT between addressed nodes) carried by NATS.
//
// Every node only dials out, to NATS. A node is reached on its own subject, which it
// subscribes to on its own outbound connection; this is Mu's connection reuse without a
// registry of channels: the coordinator reaches a worker behind NAT through the worker's
// subscription. A message to "any node of a role" goes to a role-wide subject served
// in a queue group, so NATS balances it over the role's nodes.
//
// Subjects:
//
//	jobbus.node.<role>.<idtoken>.<from-role>.<from-idtoken>.<path>   one node's handler for path
//	jobbus.role.<role>.<from-role>.<from-idtoken>.<path>             any node of role (queue group "<role>")
//	jobbus.presence.<role>.<idtoken>                                 heartbeats and goodbyes
//
// An id token is the id itself when it is plain ([A-Za-z0-9_-]), otherwise "~" and the
// id in unpadded base64url, so any id a TCP worker chooses stays one safe token.
//
// The sender (from-role, from-idtoken) is part of every subject a node sends to, and
// handlers subscribe with wildcards in its place and read it from the subject
// (Request.From). So NATS publish permissions decide who may speak as whom: a user
// allowed to publish only to "jobbus.role.coordinator.worker.edge-1.>" can ask the
// coordinators only as worker edge-1, whatever its payloads say.
//
// The Mu envelope travels in headers (Jobbus-Kind, Jobbus-Request-Id, Jobbus-Path;
// Jobbus-From on presence messages); the payload is the message's JSON. Asks use NATS request-reply through
// one reply subscription per node, so an ask to a node that is not there fails at once
// (NATS no-responders) with ErrNoPeer.
package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/internal/natsurl"
)

// Node is one addressed participant of the bus: it sends tells and asks, and serves
// handlers on its own subjects and, optionally, its role's. A Node is safe for
// concurrent use.
type Node struct {
	nc   *nats.Conn
	own  bool // Close closes nc
	self Address
	from string // self.String(), the Jobbus-From of its heartbeats and goodbyes
	// sendAs is senderTokens(self), which names the node in every subject it sends to.
	sendAs string
	cfg    config
	log    *slog.Logger

	// ctx is given to handlers and ends when Close starts.
	ctx    context.Context
	cancel context.CancelFunc
	// slots bounds running handlers: a handler holds a slot while it runs, and Close
	// waits for all of them by taking every slot.
	slots chan struct{}
	// ownSlots are the slots of the paths served with OwnSlots, each path's own, which
	// Close takes too; guarded by mu.
	ownSlots []chan struct{}
	// handoff passes a message to an idle handler goroutine (see dispatch); pool
	// counts those goroutines, running or idle, so that Close can wait for them.
	handoff chan handlerCall
	pool    sync.WaitGroup

	// inbox is the prefix of the node's reply subjects; mux receives every answer.
	inbox string
	mux   *nats.Subscription

	// pendMu guards pending, nextID and closed: the asks waiting for an answer.
	pendMu  sync.Mutex
	pending map[uint64]*pendingAsk
	nextID  uint64
	closed  bool

	// mu guards handlers and presences.
	mu        sync.Mutex
	handlers  map[string]*handling
	presences map[*Presence]struct{}

	status chan nats.Status // connection events, drained by watchStatus
	kick   chan struct{}    // asks the heartbeat loop to announce now (after reconnect)
	wg     sync.WaitGroup   // watchStatus and heartbeat loop

	outPool   sync.Pool // *outMsg
	pendPool  sync.Pool // *pendingAsk
	timerPool sync.Pool // *time.Timer

	closeOnce sync.Once
	closeErr  error

	stats counters
}

// Connect opens a connection of its own to the NATS server(s) at url and returns a node
// on it; Close closes the connection. Start-up never waits for the network: when no
// server answers, Connect returns at once and the connection keeps trying (forever, with
// a bounded reconnect buffer); asks fail with ErrDisconnected until it is up.
func Connect(ctx context.Context, url string, self Address, opts ...Option) (*Node, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bus: connect: %w", err)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := validSelf(self); err != nil {
		return nil, err
	}
	nopts := append([]nats.Option{
		nats.Name("jobbus " + self.String()),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectBufSize(cfg.reconnectBuf),
	}, cfg.natsOpts...)
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		return nil, fmt.Errorf("bus: connect %s: %w", url, err)
	}
	n, err := newNode(nc, self, cfg, true)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return n, nil
}

// New returns a node on a connection it shares: Close leaves nc open. The bridge runs
// one node per TCP worker on one connection; the nodes are independent of each other.
// New does not change nc's handlers; it watches nc's status through its own listener.
func New(nc *nats.Conn, self Address, opts ...Option) (*Node, error) {
	if nc == nil {
		return nil, errors.New("bus: nil connection")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := validSelf(self); err != nil {
		return nil, err
	}
	return newNode(nc, self, cfg, false)
}

func validSelf(self Address) error {
	if err := self.Validate(); err != nil {
		return err
	}
	if self.ID == "" {
		return fmt.Errorf("%w: a node needs an id", ErrInvalidAddress)
	}
	return nil
}

func newNode(nc *nats.Conn, self Address, cfg config, own bool) (*Node, error) {
	n := &Node{
		nc: nc, own: own, self: self, from: self.String(), sendAs: senderTokens(self), cfg: cfg,
		log:       cfg.logger.With("node", self.String()),
		slots:     make(chan struct{}, cfg.maxInFlight),
		handoff:   make(chan handlerCall),
		inbox:     nc.NewInbox(),
		pending:   make(map[uint64]*pendingAsk),
		handlers:  make(map[string]*handling),
		presences: make(map[*Presence]struct{}),
		kick:      make(chan struct{}, 1),
	}
	n.outPool.New = newOutMsg
	n.pendPool.New = func() any { return &pendingAsk{ch: make(chan askResult, 1)} }
	mux, err := nc.Subscribe(n.inbox+".*", n.onAnswer)
	if err != nil {
		return nil, fmt.Errorf("bus: subscribe replies: %w", err)
	}
	n.mux = mux
	n.ctx, n.cancel = context.WithCancel(context.Background())
	// Listen before reading the status, so no change between the two is missed.
	n.status = nc.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
	up := nc.IsConnected()
	n.wg.Add(1)
	go n.watchStatus(up)
	if cfg.heartbeat > 0 {
		n.wg.Add(1)
		go n.heartbeatLoop()
	}
	return n, nil
}

// Self is the node's address.
func (n *Node) Self() Address { return n.self }

// Conn is the node's NATS connection.
func (n *Node) Conn() *nats.Conn { return n.nc }

// Stats returns a snapshot of the node's counters.
func (n *Node) Stats() Stats {
	s := n.stats.snapshot()
	s.InFlight = len(n.slots)
	n.mu.Lock()
	for _, own := range n.ownSlots {
		s.InFlight += len(own)
	}
	n.mu.Unlock()
	if n.ctx.Err() != nil {
		s.InFlight = 0 // Close holds every slot
	}
	return s
}

// watchStatus follows the connection's status: when it goes down, every waiting ask
// fails with ErrDisconnected, since NATS would keep it waiting for an answer that the
// reconnected connection can no longer receive. It is the only writer of up.
func (n *Node) watchStatus(up bool) {
	defer n.wg.Done()
	everUp := up
	for s := range n.status {
		switch s {
		case nats.CONNECTED:
			if up {
				continue
			}
			up = true
			if everUp {
				n.stats.reconnects.Add(1)
				n.log.Info("bus reconnected", "server", natsurl.Connected(n.nc))
			}
			everUp = true
			select {
			case n.kick <- struct{}{}:
			default:
			}
		default: // RECONNECTING, DISCONNECTED, CLOSED
			n.failPending(fmt.Errorf("connection %s: %w", statusText(s), ErrDisconnected), false)
			if up {
				up = false
				n.stats.disconnects.Add(1)
				n.log.Warn("bus disconnected", "status", s.String())
			}
		}
	}
}

func statusText(s nats.Status) string {
	if s == nats.CLOSED {
		return "closed"
	}
	return "lost"
}

// Close stops the node: handlers stop receiving (their context ends and Close waits for
// those running), asks that reached the node but wait for a handler are answered with
// an ERROR of CodeUnavailable, the node's own asks still waiting fail with ErrClosed,
// and, once the running handlers have answered, a goodbye tells presence watchers the
// node left. A connection of its own (Connect) is flushed and closed. Beyond the
// running handlers, Close waits for the server one ask timeout at most for the drain
// of all its paths, and on a shared connection (New) one more for the final flush: a
// stalled server costs that, not one per path.
// Close is idempotent; it must not be called from a handler of the node.
func (n *Node) Close() error {
	n.closeOnce.Do(func() { n.closeErr = n.close() })
	return n.closeErr
}

func (n *Node) close() error {
	n.cancel()
	n.mu.Lock()
	handlers, presences, ownSlots := n.handlers, n.presences, n.ownSlots
	n.handlers, n.presences = nil, nil
	n.mu.Unlock()

	var errs []error
	for p := range presences {
		errs = append(errs, p.Close())
	}
	// One drain for every path, so that one ask timeout bounds them all: a stalled
	// server would make a drain per path wait out one each.
	var subs []*nats.Subscription
	for _, h := range handlers {
		subs = append(subs, h.subs...)
	}
	errs = append(errs, n.drain(subs...))
	n.failPending(ErrClosed, true)
	n.nc.RemoveStatusListener(n.status) // ends watchStatus
	n.wg.Wait()                         // and the heartbeat loop
	// Wait for running handlers, by taking every slot.
	for _, slots := range append([]chan struct{}{n.slots}, ownSlots...) {
		for range cap(slots) {
			slots <- struct{}{}
		}
	}
	n.pool.Wait() // and for the idle ones, which leave when n.ctx ends
	// Only now: a watcher fails the asks still waiting for the node at its goodbye
	// (Presence), so every answer must have gone before it.
	n.sayGoodbye()
	errs = append(errs, unsubscribe(n.mux))
	if n.own {
		n.nc.Close() // flushes
	} else {
		n.sync()
	}
	return errors.Join(errs...)
}

// drain ends handler subscriptions of a closing node or an unhandled path: the server
// stops sending at once, and the messages the node already received still reach
// dispatch, which refuses them (the node's context has ended, or the path's stop is
// closed), so that no ask that reached the node waits out its timeout. While the connection is down, or when draining takes longer than the ask
// timeout, it unsubscribes instead.
func (n *Node) drain(subs ...*nats.Subscription) error {
	if !n.nc.IsConnected() {
		return unsubscribe(subs...)
	}
	closed := make([]<-chan nats.SubStatus, 0, len(subs))
	for _, s := range subs {
		ch := s.StatusChanged(nats.SubscriptionClosed) // closed when the drain ends
		if err := s.Drain(); err != nil {
			return unsubscribe(subs...)
		}
		closed = append(closed, ch)
	}
	t := n.timer(n.cfg.askTimeout)
	defer n.putTimer(t)
	for _, ch := range closed {
		select {
		case <-ch:
		case <-t.C:
			return unsubscribe(subs...)
		}
	}
	return nil
}

// unsubscribe ends subscriptions, ignoring those the connection already ended.
func unsubscribe(subs ...*nats.Subscription) error {
	var errs []error
	for _, s := range subs {
		err := s.Unsubscribe()
		if err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
			errs = append(errs, fmt.Errorf("bus: unsubscribe %s: %w", s.Subject, err))
		}
	}
	return errors.Join(errs...)
}

// publish sends an envelope, counting it. The subject names the sender; a presence
// message names it in the Jobbus-From header too. Errors are the bus's sentinels where
// they apply.
func (n *Node) publish(subj, reply string, k Kind, id, path string, data []byte) error {
	return n.publishFrom(subj, reply, k, id, path, "", data)
}

func (n *Node) publishFrom(subj, reply string, k Kind, id, path, from string, data []byte) error {
	if n.cfg.envelope == Envelope2 && from == "" && bare(k, reply) {
		var err error
		if reply == "" {
			err = n.nc.Publish(subj, data)
		} else {
			err = n.nc.PublishRequest(subj, reply, data)
		}
		if err != nil {
			return n.sendError(err)
		}
		n.stats.countSent(k, len(data))
		return nil
	}
	o := n.outPool.Get().(*outMsg)
	o.set(subj, reply, k, id, path, from, data)
	err := n.nc.PublishMsg(&o.m)
	o.reset()
	n.outPool.Put(o)
	if err != nil {
		return n.sendError(err)
	}
	n.stats.countSent(k, len(data))
	return nil
}

// bare reports whether a message of kind k with reply says all an Envelope2 receiver
// needs without headers: a tell (no reply), an ask (a reply) or a RESPONSE.
func bare(k Kind, reply string) bool {
	switch k {
	case KindTell:
		return reply == ""
	case KindAsk:
		return reply != ""
	case KindResponse:
		return reply == ""
	}
	return false
}

// sendError maps a publish failure: anything the connection being down explains is
// ErrDisconnected (a connection that never connected refuses headers, too).
func (n *Node) sendError(err error) error {
	switch {
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrReconnectBufExceeded),
		errors.Is(err, nats.ErrConnectionDraining):
		return fmt.Errorf("%w: %w", ErrDisconnected, err)
	case errors.Is(err, nats.ErrHeadersNotSupported) && !n.nc.IsConnected():
		// nats.go's words would send the reader looking at the server's version.
		return fmt.Errorf("%w: not connected to NATS yet", ErrDisconnected)
	}
	return err
}

// timer returns a stopped-and-reset pooled timer firing after d.
func (n *Node) timer(d time.Duration) *time.Timer {
	if t, ok := n.timerPool.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

func (n *Node) putTimer(t *time.Timer) {
	t.Stop() // since Go 1.23 a stopped timer's channel holds no stale value
	n.timerPool.Put(t)
}
