package bus

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// heartbeatLoop announces the node on its presence subject at once, every interval,
// and again as soon as a lost connection is back. While the connection is down it
// stays silent rather than filling the reconnect buffer with stale heartbeats.
func (n *Node) heartbeatLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.heartbeat)
	defer t.Stop()
	subj := presenceSubject(n.self)
	for {
		if n.nc.IsConnected() {
			if err := n.publishFrom(subj, "", KindHeartbeat, "", "", n.from, nil); err != nil {
				n.log.Debug("bus heartbeat not sent", "err", err)
			}
		}
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		case <-n.kick:
		}
	}
}

// sayGoodbye tells presence watchers that the node leaves.
func (n *Node) sayGoodbye() {
	if !n.nc.IsConnected() {
		return
	}
	o := n.outPool.Get().(*outMsg)
	o.set(presenceSubject(n.self), "", KindHeartbeat, "", "", n.from, nil)
	o.present[0] = presenceLeave
	o.m.Header[HeaderPresence] = o.present[:]
	err := n.nc.PublishMsg(&o.m)
	o.reset()
	n.outPool.Put(o)
	if err != nil {
		n.log.Debug("bus goodbye not sent", "err", err)
		return
	}
	n.stats.countSent(KindHeartbeat, 0)
}

// Presence follows which nodes of a role are alive, from their heartbeats (WithHeartbeat).
// A node joins with its first heartbeat and leaves with its goodbye (Node.Close) or when
// none was heard within the timeout. When a node leaves, the asks to it (to that node,
// not to its role) that the watching node still waits for fail at once with
// CodeUnavailable (see Ask): a node killed mid-ask costs its asker the timeout, not
// the ask timeout.
type Presence struct {
	n        *Node
	role     Role
	timeout  time.Duration
	onJoin   func(Address)
	onLeave  func(Address)
	sub      *nats.Subscription
	msgs     chan *nats.Msg
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
	closeErr error

	mu   sync.Mutex // guards seen; the loop goroutine is its only writer
	seen map[Address]time.Time
}

// presenceBuffer bounds heartbeats waiting for the watcher; beyond it NATS drops them,
// which costs at most a spurious leave and join.
const presenceBuffer = 4096

// WatchPresence follows the nodes of role on n's connection. onJoin and onLeave (either
// may be nil) are called one at a time, in order, from the watcher's own goroutine. The
// watcher stops on Close or when n closes.
func WatchPresence(n *Node, role Role, timeout time.Duration, onJoin, onLeave func(Address)) (*Presence, error) {
	if err := (Address{Role: role}).Validate(); err != nil {
		return nil, err
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("bus: presence timeout must be positive, got %v", timeout)
	}
	p := &Presence{
		n: n, role: role, timeout: timeout, onJoin: onJoin, onLeave: onLeave,
		msgs: make(chan *nats.Msg, presenceBuffer),
		stop: make(chan struct{}), done: make(chan struct{}),
		seen: make(map[Address]time.Time),
	}
	if err := p.start(); err != nil {
		return nil, err
	}
	n.sync()
	return p, nil
}

func (p *Presence) start() error {
	p.n.mu.Lock()
	defer p.n.mu.Unlock()
	if p.n.presences == nil {
		return fmt.Errorf("watch presence: %w", ErrClosed)
	}
	sub, err := p.n.nc.ChanSubscribe(subjectPresence+string(p.role)+".*", p.msgs)
	if err != nil {
		return fmt.Errorf("watch presence of %s: %w", p.role, err)
	}
	p.sub = sub
	p.n.presences[p] = struct{}{}
	go p.loop()
	return nil
}

// Alive returns the nodes heard from within the timeout, sorted by address.
func (p *Presence) Alive() []Address {
	p.mu.Lock()
	out := make([]Address, 0, len(p.seen))
	for a := range p.seen {
		out = append(out, a)
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b Address) int {
		return cmp.Or(cmp.Compare(a.Role, b.Role), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// Close stops watching; it waits for a callback that is running. Idempotent.
func (p *Presence) Close() error {
	p.once.Do(func() {
		p.n.mu.Lock()
		delete(p.n.presences, p) // a no-op while the node closes (presences is nil)
		p.n.mu.Unlock()
		p.closeErr = unsubscribe(p.sub)
		close(p.stop)
		<-p.done
	})
	return p.closeErr
}

func (p *Presence) loop() {
	defer close(p.done)
	sweep := time.NewTicker(max(p.timeout/4, time.Millisecond))
	defer sweep.Stop()
	for {
		select {
		case <-p.stop:
			return
		case m := <-p.msgs:
			p.heard(m)
		case now := <-sweep.C:
			p.expire(now)
		}
	}
}

// heard handles a heartbeat or goodbye.
func (p *Presence) heard(m *nats.Msg) {
	p.n.stats.countRecv(KindHeartbeat, len(m.Data))
	if Kind(first(m.Header[HeaderKind])) != KindHeartbeat {
		p.n.stats.dropped.Add(1)
		return
	}
	from, err := ParseAddress(first(m.Header[HeaderFrom]))
	if err == nil && (from.ID == "" || presenceSubject(from) != m.Subject) {
		err = errors.New("sender does not match subject")
	}
	if err != nil {
		p.n.stats.dropped.Add(1)
		p.n.log.Debug("bus dropped presence message", "subject", m.Subject, "err", err)
		return
	}
	leaving := first(m.Header[HeaderPresence]) == presenceLeave
	p.mu.Lock()
	_, known := p.seen[from]
	if leaving {
		delete(p.seen, from)
	} else {
		p.seen[from] = time.Now()
	}
	p.mu.Unlock()
	if leaving {
		p.n.peerLeft(from) // known or not: its goodbye says no answer will come
	}
	switch {
	case leaving && known && p.onLeave != nil:
		p.onLeave(from)
	case !leaving && !known && p.onJoin != nil:
		p.onJoin(from)
	}
}

// expire makes the nodes not heard within the timeout leave.
func (p *Presence) expire(now time.Time) {
	var gone []Address
	p.mu.Lock()
	for a, at := range p.seen {
		if now.Sub(at) > p.timeout {
			delete(p.seen, a)
			gone = append(gone, a)
		}
	}
	p.mu.Unlock()
	for _, a := range gone {
		p.n.peerLeft(a)
		if p.onLeave != nil {
			p.onLeave(a)
		}
	}
}
