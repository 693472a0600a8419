package bridge

// The Mu port: PowerJob's Mu frames (package bus/protocol/mu), so that a node
// that speaks them joins the bus as a peer.
//
// A HEARTBEAT carrying senderAddress registers the connection as the bus node
// bus.Address{Role: bus.RoleMu, ID: "host:port"} (PowerJob's registerWorkerChannel):
// tells and asks that any bus node sends to that address are written to this
// connection, and the node's RESPONSE or ERROR (matched by requestId) is the answer.
// A HEARTBEAT that carries a requestId (which PowerJob's never do) gets a RESPONSE once
// served, whose payload is the node's bus address. Any frame keeps the connection alive; one that sends nothing for MuIdleTimeout is
// closed. When the connection ends the node is gone: asks waiting for it fail at once
// (PowerJob's fail-fast rule) and later ones find no peer. A second connection
// registering a live address supersedes the first, which is closed.
//
// TELL and ASK from the node go where their path says (muRoute): "<path>@<role>/<id>"
// to one bus node, "<path>@<role>" to any node of a role, "<path>@<host:port>" to
// another Mu node; the node must have registered. An ASK on a client API subject
// ("jobbus.api.submit", ...) carries the client port's request as its payload and gets
// the client port's reply as its RESPONSE payload, registered or not. Every ASK gets
// exactly one RESPONSE or ERROR with its requestId, within RequestTimeout; a connection
// has at most MaxInFlight of its ASKs in flight, and one beyond gets its ERROR at once.
//
// Bad input costs only its own connection: a frame with a bad length or that is not a
// MuMessage gets an ERROR ("Malformed request: ...") and the connection closes; a
// well-formed message the bridge cannot act on gets an ERROR (with its requestId, if
// any) and the connection stays.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/bus/protocol/mu"
)

// muPresence is how often a Mu node's bus node announces itself to presence watchers
// (bus.WatchPresence of bus.RoleMu), while its connection lives.
const muPresence = 2 * time.Second

var (
	// errMuIdle: a Mu connection sent nothing for MuIdleTimeout.
	errMuIdle = errors.New("idle")
	// errStopped: the session stopped reading (superseded).
	errStopped = errors.New("stopped")
)

// muSession is one connection of the Mu port. Its reading goroutine (serveMu) owns
// reader and is the only one to register; asks from the node run on goroutines of
// their own (asks), bounded by slots: an ASK beyond them is refused at once.
type muSession struct {
	b      *Bridge
	conn   net.Conn
	reader *frame.Reader
	out    *outbox
	log    *slog.Logger
	ctx    context.Context // ends when the session ends: the node's asks stop
	cancel context.CancelFunc
	asks   sync.WaitGroup
	slots  chan struct{}

	mu  sync.Mutex
	reg *muNode // nil until registered, and again once superseded
	// superseded is set when a newer connection registered the node's address: the
	// session stops reading and closes.
	superseded atomic.Bool
}

// muNode is a registered Mu node: its bus node and the asks the bus sent it that wait
// for its answer.
type muNode struct {
	s    *muSession
	addr mu.Address
	key  string // addr.String(), the bus node's id
	node *bus.Node

	mu      sync.Mutex // guards pending, next and gone
	pending map[string]chan *mu.Message
	next    uint64
	gone    bool
	once    sync.Once
}

// muRegistry maps the live Mu nodes' addresses to their registrations; its zero value
// is empty.
type muRegistry struct {
	mu   sync.Mutex
	live map[string]*muNode
}

// claim makes n the live node of its address and returns the one it replaces.
func (r *muRegistry) claim(n *muNode) *muNode {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live == nil {
		r.live = make(map[string]*muNode)
	}
	old := r.live[n.key]
	r.live[n.key] = n
	return old
}

// drop forgets n unless another node took its address over.
func (r *muRegistry) drop(n *muNode) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live[n.key] == n {
		delete(r.live, n.key)
	}
}

// MuAddr is the Mu port's address once started, nil if disabled.
func (b *Bridge) MuAddr() net.Addr { return b.addr("mu") }

// serveMu runs one Mu-port connection until it ends.
func (b *Bridge) serveMu(c net.Conn, release func()) {
	defer release()
	ctx, cancel := context.WithCancel(b.ctx)
	s := &muSession{
		b: b, conn: c, reader: frame.NewReader(c),
		out: newOutbox(c, b.cfg.WriteQueue, b.cfg.WriteTimeout, b.cfg.FrameStallTimeout),
		log: b.log.With("port", "mu", "remote", c.RemoteAddr().String()),
		ctx: ctx, cancel: cancel,
		slots: make(chan struct{}, b.cfg.MaxInFlight),
	}
	s.log.Debug("mu connected")
	last := s.loop()
	if last != nil {
		s.out.finish(last)
	} else {
		s.out.kill("closed")
	}
	cancel()
	if n := s.registration(); n != nil {
		n.leave()
	}
	s.asks.Wait()
	s.out.wait()
}

// loop reads and serves frames until the connection ends, and returns the last frame
// to write before closing, if any.
func (s *muSession) loop() []byte {
	for {
		payload, err := readFrameWithin(s.conn, s.reader, s.b.cfg.FrameStallTimeout, s.b.cfg.MuIdleTimeout, s.superseded.Load)
		if s.superseded.Load() {
			return s.encode(&mu.Message{MessageType: mu.TypeError, ErrorMessage: "superseded: another connection registered this address"})
		}
		if errors.Is(err, errMuIdle) {
			s.log.Info("mu node idle; closing", "idle", s.b.cfg.MuIdleTimeout)
			return s.encode(&mu.Message{MessageType: mu.TypeError,
				ErrorMessage: fmt.Sprintf("no message within %v: send HEARTBEAT more often", s.b.cfg.MuIdleTimeout)})
		}
		if err != nil {
			var last []byte
			s.b.readFailed(s.log, err, "mu", func([]byte) {
				last = s.encode(&mu.Message{MessageType: mu.TypeError, ErrorMessage: protocol.MalformedRequest(err).Message})
			})
			return last
		}
		m, err := mu.Decode(payload)
		if err != nil {
			s.b.stats.malformed("mu")
			s.log.Info("malformed message; closing", "err", err)
			return s.encode(&mu.Message{MessageType: mu.TypeError, ErrorMessage: protocol.MalformedRequest(err).Message})
		}
		if s.b.ctx.Err() != nil {
			return nil
		}
		s.serve(m)
	}
}

// serve acts on one message from the node.
func (s *muSession) serve(m *mu.Message) {
	switch m.MessageType {
	case mu.TypeHeartbeat:
		if m.SenderAddress != nil {
			if err := s.register(*m.SenderAddress); err != nil {
				s.complain(m, err.Error())
				return
			}
		}
		if m.RequestID != "" {
			// Not in PowerJob's Mu, which answers no HEARTBEAT: one with a requestId gets a
			// RESPONSE once it is served, so a node knows when the bus can reach it.
			s.send(&mu.Message{MessageType: mu.TypeResponse, RequestID: m.RequestID, Payload: s.registeredAs()})
		}
	case mu.TypeTell:
		if err := s.tell(m); err != nil {
			s.complain(m, err.Error())
		}
	case mu.TypeAsk:
		if m.RequestID == "" {
			s.complain(m, "an ASK needs a requestId")
			return
		}
		// Refused rather than waited for: the reading must go on, since the node's
		// answers to asks from the bus (perhaps from the very handlers its asks wait
		// on) come on this connection too.
		select {
		case s.slots <- struct{}{}:
		default:
			s.complain(m, fmt.Sprintf("too many asks in flight: a connection may have %d at once; ask again once some are answered", cap(s.slots)))
			return
		}
		s.asks.Add(1)
		go func() {
			defer s.asks.Done()
			defer func() { <-s.slots }()
			s.send(s.ask(m))
		}()
	case mu.TypeResponse, mu.TypeError:
		if n := s.registration(); n != nil {
			n.answered(m)
		}
	}
}

// complain answers a message the bridge cannot act on with an ERROR; the connection
// stays.
func (s *muSession) complain(m *mu.Message, text string) {
	s.log.Debug("mu message refused", "type", m.MessageType, "path", clip(m.Path), "err", text)
	s.send(&mu.Message{MessageType: mu.TypeError, RequestID: m.RequestID, Path: m.Path, ErrorMessage: text})
}

// encode encodes a message for the connection. One that would not fit in a frame
// becomes an ERROR with the same requestId.
func (s *muSession) encode(m *mu.Message) []byte {
	data, err := mu.Encode(m)
	if err == nil && len(data) > frame.MaxSize {
		s.log.Warn("mu message exceeds the frame limit; sending ERROR instead", "path", clip(m.Path), "bytes", len(data))
		err = errors.New(errReplyTooLarge(len(data)).Message)
	}
	if err != nil {
		data, _ = mu.Encode(&mu.Message{MessageType: mu.TypeError, RequestID: m.RequestID, Path: m.Path, ErrorMessage: err.Error()})
	}
	return data
}

// send queues a message for the connection; a full queue drops the connection.
func (s *muSession) send(m *mu.Message) bool { return s.out.send(s.encode(m)) }

// registeredAs is the payload of a HEARTBEAT's RESPONSE: the bus address of the node
// ("mu/<idtoken>") as a JSON string, or null before it registered.
func (s *muSession) registeredAs() json.RawMessage {
	n := s.registration()
	if n == nil {
		return nil
	}
	data, _ := json.Marshal(n.node.Self().String())
	return data
}

func (s *muSession) registration() *muNode {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reg
}

// register makes the connection the bus node of addr, superseding the connection that
// had it. Once registered, a HEARTBEAT with the same address only keeps it alive.
func (s *muSession) register(addr mu.Address) error {
	if addr.Host == "" {
		return errors.New("senderAddress needs a host")
	}
	key := addr.String()
	if n := s.registration(); n != nil {
		if n.key != key {
			return fmt.Errorf("this connection is registered as %s; register %s on a connection of its own", n.key, key)
		}
		return nil
	}
	n := &muNode{s: s, addr: addr, key: key, pending: make(map[string]chan *mu.Message)}
	if old := s.b.muNodes.claim(n); old != nil {
		s.log.Info("mu node re-registered; superseding the previous connection", "mu", key)
		old.s.supersede(old)
	}
	node, err := bus.New(s.b.nc, bus.Address{Role: bus.RoleMu, ID: key},
		bus.WithLogger(s.log), bus.WithAskTimeout(s.b.cfg.RequestTimeout), bus.WithHeartbeat(muPresence))
	if err == nil {
		s.b.stats.track(node)
		if err = node.HandleAny(n.fromBus); err != nil {
			s.b.stats.retire(node)
		}
	}
	if err != nil {
		s.b.muNodes.drop(n)
		return fmt.Errorf("register %s: %w", key, err)
	}
	// A connection registering the same address at the same time may have superseded
	// this one already: then leave found no node to close, and the node is closed here.
	n.mu.Lock()
	gone := n.gone
	if !gone {
		n.node = node
	}
	n.mu.Unlock()
	if gone {
		s.b.stats.retire(node)
		return fmt.Errorf("register %s: superseded by another connection", key)
	}
	s.mu.Lock()
	s.reg = n
	s.mu.Unlock()
	s.log = s.log.With("mu", key)
	s.log.Info("mu node registered")
	return nil
}

// supersede ends the session of n, whose address a newer connection registered: the
// node leaves now (so that the new one is the only node of the address), and the
// connection closes after an ERROR saying why.
func (s *muSession) supersede(n *muNode) {
	s.superseded.Store(true)
	s.mu.Lock()
	if s.reg == n {
		s.reg = nil
	}
	s.mu.Unlock()
	n.leave()
	// Wake the session's reading, which then stops (readFrameWithin) and closes.
	_ = s.conn.SetReadDeadline(time.Now())
}

// leave takes the node off the bus: asks waiting for its answers fail at once, and its
// bus node closes, so later ones find no peer. It is idempotent.
func (n *muNode) leave() {
	n.once.Do(func() {
		n.mu.Lock()
		n.gone = true
		pending, node := n.pending, n.node
		n.pending = nil
		n.mu.Unlock()
		for _, ch := range pending {
			close(ch)
		}
		n.s.b.muNodes.drop(n)
		if node != nil {
			n.s.b.stats.retire(node) // closes it
		}
		n.s.log.Info("mu node left", "failed_asks", len(pending))
	})
}

// fromBus serves every message the bus sends to the node: a TELL is written to the
// connection; an ASK too, with a requestId of the bridge's, and its answer is the
// node's RESPONSE or ERROR.
func (n *muNode) fromBus(ctx context.Context, r *bus.Request) (any, error) {
	m := &mu.Message{MessageType: mu.TypeTell, Path: r.Path, SenderAddress: muSender(r.From), Payload: mu.Payload(r.Data)}
	if r.Kind == bus.KindTell {
		n.s.send(m)
		return nil, nil
	}
	id, ch, ok := n.expect()
	if !ok {
		return nil, n.goneError()
	}
	m.MessageType, m.RequestID = mu.TypeAsk, id
	if !n.s.send(m) {
		n.forget(id, ch)
		return nil, bus.Errorf(bus.CodeUnavailable, "mu node %s: its connection is dropped", n.key)
	}
	t := time.NewTimer(n.s.b.cfg.RequestTimeout)
	defer t.Stop()
	select {
	case a, ok := <-ch:
		switch {
		case !ok:
			return nil, n.goneError()
		case a.MessageType == mu.TypeError:
			return nil, errors.New(a.ErrorMessage)
		}
		return json.RawMessage(a.Payload), nil
	case <-t.C:
	case <-ctx.Done():
	}
	if a, answered := n.forget(id, ch); answered {
		if a == nil {
			return nil, n.goneError()
		}
		if a.MessageType == mu.TypeError {
			return nil, errors.New(a.ErrorMessage)
		}
		return json.RawMessage(a.Payload), nil
	}
	return nil, bus.Errorf(bus.CodeUnavailable, "mu node %s: no answer within %v", n.key, n.s.b.cfg.RequestTimeout)
}

func (n *muNode) goneError() error {
	return bus.Errorf(bus.CodeUnavailable, "mu node %s disconnected", n.key)
}

// expect registers an ask to the node and returns its requestId and the channel its
// answer arrives on (closed if the node leaves first); ok is false once it has left.
func (n *muNode) expect() (id string, ch chan *mu.Message, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gone {
		return "", nil, false
	}
	n.next++
	id = "jobbus-" + strconv.FormatUint(n.next, 36)
	ch = make(chan *mu.Message, 1)
	n.pending[id] = ch
	return id, ch, true
}

// forget gives up an ask. When its answer came first, or the node left first, that
// outcome is already on ch: forget returns it (nil if the node left), answered true.
func (n *muNode) forget(id string, ch chan *mu.Message) (a *mu.Message, answered bool) {
	n.mu.Lock()
	_, mine := n.pending[id]
	delete(n.pending, id)
	n.mu.Unlock()
	if mine {
		return nil, false
	}
	return <-ch, true
}

// answered hands the node's RESPONSE or ERROR to the ask waiting for it; an answer
// nobody waits for (late, or made up) is dropped.
func (n *muNode) answered(m *mu.Message) {
	n.mu.Lock()
	ch := n.pending[m.RequestID]
	delete(n.pending, m.RequestID)
	n.mu.Unlock()
	if ch == nil {
		n.s.log.Debug("mu answer nobody waits for", "type", m.MessageType, "request", clip(m.RequestID))
		return
	}
	ch <- m
}

// muSender is the senderAddress of a message the bus sends to a Mu node: the sender's
// own address when it is a Mu node, otherwise its bus address as the host ("role/id")
// and port 0, so that "<path>@<host>" reaches it either way.
func muSender(from bus.Address) *mu.Address {
	if from.Role == bus.RoleMu {
		// The id is mu.Address.String(), host + ":" + port, whatever colons the host
		// holds (an IPv6 one), so the port is after the last colon.
		if i := strings.LastIndexByte(from.ID, ':'); i > 0 {
			if port, err := strconv.Atoi(from.ID[i+1:]); err == nil && port >= 0 && port <= 65535 {
				return &mu.Address{Host: from.ID[:i], Port: port}
			}
		}
	}
	return &mu.Address{Host: string(from.Role) + "/" + from.ID}
}

// tell passes a TELL from the node on to where its path says.
func (s *muSession) tell(m *mu.Message) error {
	if isAPISubject(m.Path) {
		return fmt.Errorf("%s takes an ASK, not a TELL", m.Path)
	}
	n := s.registration()
	if n == nil {
		return errNotRegistered
	}
	to, path, err := muRoute(m.Path)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.b.cfg.RequestTimeout)
	defer cancel()
	return n.node.Tell(ctx, to, path, json.RawMessage(m.Payload))
}

var errNotRegistered = errors.New("not registered: send a HEARTBEAT with senderAddress first (only jobbus.api.* serves unregistered connections)")

// ask serves an ASK from the node and returns its one answer.
func (s *muSession) ask(m *mu.Message) *mu.Message {
	answer := func(payload []byte, err error) *mu.Message {
		if err != nil {
			return &mu.Message{MessageType: mu.TypeError, RequestID: m.RequestID, Path: m.Path, ErrorMessage: err.Error()}
		}
		return &mu.Message{MessageType: mu.TypeResponse, RequestID: m.RequestID, Path: m.Path, Payload: mu.Payload(payload)}
	}
	if isAPISubject(m.Path) {
		return answer(s.api(m))
	}
	n := s.registration()
	if n == nil {
		return answer(nil, errNotRegistered)
	}
	to, path, err := muRoute(m.Path)
	if err != nil {
		return answer(nil, err)
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.b.cfg.RequestTimeout)
	defer cancel()
	data, err := bus.Ask[json.RawMessage](ctx, n.node, to, path, json.RawMessage(m.Payload))
	var re *bus.RemoteError
	if errors.As(err, &re) {
		err = errors.New(re.Message) // the remote handler's own words
	}
	return answer(data, err)
}

// api forwards a client API request as the client port does, and returns the client
// port's reply: a spec message, ERROR included, which is the RESPONSE's payload.
func (s *muSession) api(m *mu.Message) ([]byte, error) {
	if len(m.Payload) == 0 {
		return nil, fmt.Errorf("%s takes the client port's request as its payload", m.Path)
	}
	req, err := protocol.Decode(m.Payload)
	if err != nil {
		return nil, errors.New(protocol.MalformedRequest(err).Message)
	}
	if e, ok := protocol.EndpointFor(req.MessageType()); !ok || e.Subject() != m.Path {
		return nil, fmt.Errorf("%s does not serve %s", m.Path, req.MessageType())
	}
	reply, decoded, perr := s.b.request(m.Path, m.Payload, s.log)
	if perr != nil {
		return encodeError(perr), nil
	}
	if m.Path == submitManySubject && decoded {
		reply = s.b.settleBatch(m.Payload, reply, s.log) // as the client port does
	}
	return reply, nil
}

// isAPISubject reports whether path is an endpoint of the client API.
func isAPISubject(path string) bool {
	for _, e := range protocol.Endpoints {
		if path == e.Subject() {
			return true
		}
	}
	return false
}

// muRoute reads where a Mu path goes: "<path>@<role>/<id>" (one bus node; "<role>/*"
// is any node of the role), "<path>@<role>" (any node of the role), or
// "<path>@<host:port>" (the Mu node of that address: a destination with a ':' and no
// '/'). The path is everything before the first '@'.
func muRoute(p string) (bus.Address, string, error) {
	path, to, ok := strings.Cut(p, "@")
	if !ok || path == "" || to == "" {
		return bus.Address{}, "", fmt.Errorf("path %q names no destination: write <path>@<role>/<id>, <path>@<role> or <path>@<host:port>", clip(p))
	}
	var a bus.Address
	role, id, slash := strings.Cut(to, "/")
	switch {
	case slash && id == "*":
		a = bus.Address{Role: bus.Role(role)}
	case slash:
		a = bus.Address{Role: bus.Role(role), ID: id}
	case strings.Contains(to, ":"):
		a = bus.Address{Role: bus.RoleMu, ID: to}
	default:
		a = bus.Address{Role: bus.Role(to)}
	}
	if err := a.Validate(); err != nil {
		return bus.Address{}, "", err
	}
	return a, path, nil
}

// readFrameWithin is readFrame for the Mu port: a frame that has begun must complete
// as on the other ports, and between frames the connection may be silent for idle at
// most (errMuIdle). It returns errStopped once stopped reports true: whoever sets it
// then sets a read deadline in the past, which wakes the read, and stopped is checked
// after each deadline is set, so that the wake-up cannot be overwritten unseen.
func readFrameWithin(c net.Conn, r *frame.Reader, stall, idle time.Duration, stopped func() bool) ([]byte, error) {
	quiet := time.Now().Add(idle)
	midFrame := false
	for {
		d := time.Now().Add(stall)
		if !r.Started() && d.After(quiet) {
			d = quiet
		}
		if err := c.SetReadDeadline(d); err != nil {
			return nil, err
		}
		if stopped() {
			return nil, errStopped
		}
		p, err := r.Read()
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, err
		}
		switch {
		case stopped():
			return nil, errStopped
		case !r.Started() && !time.Now().Before(quiet):
			return nil, errMuIdle
		case !r.Started():
			midFrame = false
		case midFrame:
			return nil, fmt.Errorf("%w: no complete frame within %v", errStalled, 2*stall)
		default:
			midFrame = true
		}
	}
}
