// Package bridge serves the two framed TCP ports of PROTOCOL.md in front of a jobbus
// coordinator that lives on NATS, and a third for Mu nodes. It forwards; the
// coordinator decides.
//
// The client port (default 7071) is strict request/reply: each frame's payload is sent
// unchanged to the coordinator's API endpoint for its type (protocol.EndpointFor) and
// the reply body is written back unchanged, one reply per request, in the requests'
// order. A request waits for the replies ahead of it, except submissions sent ahead
// of them, which are forwarded at once (ahead.go).
//
// The worker port (default 7070) turns each TCP worker into a bus node of its own:
// the bridge acts on the bus as that worker (bus.Address{Role: bus.RoleWorker, ID: id}
// on the bridge's one NATS connection), so the coordinator reaches the worker through
// the connection the worker opened, as Mu's connection reuse intends. WORKER_REGISTER,
// HEARTBEAT and TASK_RESULT become asks to the coordinator; TASK_ASSIGN and TASK_CANCEL
// become frames. HEARTBEAT and TASK_RESULT count for the registered worker, whatever
// workerId they carry. A connection that ends reports its worker lost at once (the
// bridge asks worker.disconnect once the results it already read are settled, however
// long that takes within ResultRetryFor, so a result sent just before closing still
// counts, even while no coordinator serves). A second connection registering a
// live worker id supersedes the first, which closes without reporting a loss. This
// holds within one bridge: one worker id live on two bridges at once is a
// misconfiguration, as two native workers of one id are.
//
// # Stopping
//
// Close is a graceful stop: the ports stop listening and every connection closes, so
// nothing more is read, and the TASK_RESULTs already read get up to ShutdownTimeout
// (default 10s) to be answered by the coordinator, each worker reported lost once its
// results are; a result still unanswered then is abandoned. A spec worker never sends a
// result again (its attempts end with its connection), so a stop that abandoned them at
// once would lose attempts the workers finished, when no coordinator serves for a
// moment (a failover, or one restarting beside the bridge). Only a bridge killed
// outright loses them. A worker's running attempts end with its connection, as
// PROTOCOL.md says: the spec has no message to drain a worker.
//
// The Mu port (off unless Config.MuListen is set; the seed deploys it on 7700) speaks
// PowerJob's MuMessage frames (seeds/004, package bus/protocol/mu): a node that
// registers with a HEARTBEAT carrying its senderAddress becomes the bus node
// mu/<host:port>, reached through the connection it opened, and routes its TELLs and
// ASKs by path to any bus node; the client API answers it on jobbus.api.* (mu.go).
//
// # Errors on the wire
//
// Client port: an undecodable frame (bad length, non-JSON, unknown type, wrong field
// types) gets a best-effort ERROR "Malformed request: ..." and the connection closes.
// (A client request whose type is readable goes to the coordinator undecoded, since
// the coordinator decodes it anyway; the bridge decodes it itself only when the answer
// is not the coordinator's answer to a request it decoded, and closes as above if it
// is malformed, whatever the answer was.)
// A well-formed message that is not a client request (say HEARTBEAT) gets ERROR
// "Unexpected message type ... on the client port" and the connection stays open, as
// an invalid payload's ERROR (from the coordinator) does: the peer speaks the framing
// correctly, so its later requests can still be understood. When no coordinator
// answers, the reply is ERROR "coordinator unavailable: ..." and the connection stays;
// while the bridge's own NATS connection is down that reply comes at once, and the
// request is not sent (dial the connection with nats.ReconnectBufSize(-1), as the CLI
// does, so that no publish racing the disconnect waits in nats.go's buffer either).
//
// # TLS
//
// With Config.TLS both ports speak TLS, and PROTOCOL.md's frames travel unchanged
// inside it; a client CA makes the certificate the peer's authentication, which the
// protocol itself lacks.
//
// Worker port: anything but a valid WORKER_REGISTER first, and anything but HEARTBEAT
// or TASK_RESULT afterwards, gets a best-effort ERROR and the connection closes; so
// does a registration the coordinator refuses or no coordinator answers.
//
// # Bounds
//
// A peer costs only itself: connections per port are limited (beyond the limit a new
// connection gets ERROR "too many connections (limit N)" and is closed), a frame that
// has begun must complete within the frame-stall timeout (and a worker's registration
// must begin within it), every write has a deadline,
// a worker connection's outgoing frames wait in a bounded queue (a peer that lets it
// fill is dropped), API requests in flight across the bridge are bounded, and a worker
// with too many results awaiting the coordinator is not read until some are answered
// (TCP holds it back). No reply
// larger than a frame (1 MiB) is ever written: it is replaced by an ERROR.
//
// Several bridges may serve one coordinator; a bridge holds no global state.
package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/reuse"
	"github.com/nats-io/nats.go"
)

// Errors callers match with errors.Is.
var (
	// ErrPortInUse: a listen address is taken by another process.
	ErrPortInUse = errors.New("port in use")
	// ErrClosed: the bridge was closed.
	ErrClosed = errors.New("bridge: closed")
	// ErrStarted: Start was called twice.
	ErrStarted = errors.New("bridge: already started")
)

// Config is every knob of a bridge; DefaultConfig gives the documented defaults.
type Config struct {
	// WorkerListen and ClientListen are the listen addresses of the worker and client
	// ports (defaults 127.0.0.1:7070 and 127.0.0.1:7071: loopback, DESIGN invariant 7).
	// "" disables that port; port 0 picks a free one (see WorkerAddr, ClientAddr).
	WorkerListen string
	ClientListen string
	// MuListen is the listen address of the Mu port (mu.go): PowerJob's Mu frames,
	// whose nodes join the bus. "" (the default) disables it; the seed deploys it on
	// 7700.
	MuListen string
	// MuIdleTimeout closes a Mu connection that sends nothing, not even a HEARTBEAT,
	// for this long (default 30s).
	MuIdleTimeout time.Duration
	// MaxConns bounds the open connections of each port (default 1024).
	MaxConns int
	// MaxInFlight bounds the client-port requests waiting for the coordinator at once,
	// across all connections (default 256). Further requests wait their turn. It also
	// bounds each Mu connection's own asks in flight: an ASK beyond gets an ERROR at once.
	MaxInFlight int
	// FrameStallTimeout bounds how long a frame that has begun may take to arrive
	// (default 10s): a frame gets between one and two of these. An idle connection,
	// between frames, is never timed out, except that a worker's registration must
	// begin within one.
	FrameStallTimeout time.Duration
	// WriteTimeout bounds each frame write (default 10s): a write that blocks fails
	// after at least nine tenths of it and at most all of it (the deadline is moved
	// only once a tenth of it has passed, not at every frame).
	WriteTimeout time.Duration
	// RequestTimeout bounds each request to the coordinator: an API request or a bus
	// ask (default 5s).
	RequestTimeout time.Duration
	// WriteQueue is how many frames may wait to be written to one worker or Mu
	// connection (default 256). A worker's frames beyond it wait for room (a worker may
	// be handed up to its capacity, 1024, at once); a Mu peer that lets the queue fill
	// is dropped, and so is any peer that takes no frame within WriteTimeout.
	WriteQueue int
	// ResultRetryFor is how long a TASK_RESULT keeps being offered to the coordinator
	// until it answers (default 1 minute), even after the worker's connection closed.
	// Until its results are answered or given up, a worker whose connection ended is
	// not reported lost, and a new connection of the same worker id waits for its
	// WORKER_REGISTERED: either would lose the attempts the results report.
	ResultRetryFor time.Duration
	// ShutdownTimeout bounds how long Close keeps offering the TASK_RESULTs already
	// read (default 10s, a native worker's worker.DefaultShutdownTimeout): a spec
	// worker never sends a result again, so one abandoned is an attempt lost although
	// the worker finished it. 0 abandons them at once.
	ShutdownTimeout time.Duration
	// Logger receives structured logs (keys worker, remote, port); nil discards them.
	Logger *slog.Logger
	// TLS, when set, serves both ports over TLS, framed inside the TLS stream exactly
	// as PROTOCOL.md says; a ClientCAs with ClientAuth tls.RequireAndVerifyClientCert
	// admits only peers with a certificate it signed. The handshake must complete
	// within FrameStallTimeout. nil serves plain TCP.
	TLS *tls.Config
}

// DefaultConfig returns the defaults of DESIGN.md.
func DefaultConfig() Config {
	return Config{
		WorkerListen:      "127.0.0.1:7070",
		ClientListen:      "127.0.0.1:7071",
		MaxConns:          1024,
		MaxInFlight:       256,
		FrameStallTimeout: 10 * time.Second,
		WriteTimeout:      10 * time.Second,
		RequestTimeout:    5 * time.Second,
		WriteQueue:        256,
		ResultRetryFor:    time.Minute,
		ShutdownTimeout:   10 * time.Second,
		MuIdleTimeout:     30 * time.Second,
	}
}

// Validate returns every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("bridge: "+format, args...)) }
	if c.WorkerListen == "" && c.ClientListen == "" && c.MuListen == "" {
		bad("no port to serve: WorkerListen, ClientListen and MuListen are all empty")
	}
	for _, l := range []struct{ name, addr string }{{"WorkerListen", c.WorkerListen}, {"ClientListen", c.ClientListen}, {"MuListen", c.MuListen}} {
		if l.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(l.addr); err != nil {
			bad("%s %q: %v", l.name, l.addr, err)
		}
	}
	if c.MaxConns < 1 {
		bad("MaxConns must be at least 1, got %d", c.MaxConns)
	}
	if c.MaxInFlight < 1 {
		bad("MaxInFlight must be at least 1, got %d", c.MaxInFlight)
	}
	if c.WriteQueue < 1 {
		bad("WriteQueue must be at least 1, got %d", c.WriteQueue)
	}
	if c.ShutdownTimeout < 0 {
		bad("ShutdownTimeout must not be negative, got %v", c.ShutdownTimeout)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"FrameStallTimeout", c.FrameStallTimeout}, {"WriteTimeout", c.WriteTimeout},
		{"RequestTimeout", c.RequestTimeout}, {"ResultRetryFor", c.ResultRetryFor},
		{"MuIdleTimeout", c.MuIdleTimeout},
	} {
		if d.v <= 0 {
			bad("%s must be positive, got %v", d.name, d.v)
		}
	}
	return errors.Join(errs...)
}

// Bridge serves the TCP ports for the coordinator reachable on its NATS connection.
type Bridge struct {
	nc  *nats.Conn
	cfg Config
	log *slog.Logger

	// ctx ends once Close has given the results already read their ShutdownTimeout:
	// accept loops, sessions and result deliveries watch it.
	ctx    context.Context
	cancel context.CancelFunc
	// requests bounds the client-port requests in flight across the bridge.
	requests  chan struct{}
	leaderSub *nats.Subscription // leader announcements, while started
	// workers are the live worker sessions by worker id.
	workers registry
	// muNodes are the registered nodes of the Mu port by address (mu.go).
	muNodes muRegistry

	// mu guards the fields below: the listeners and every open connection, so that
	// Close can close them all.
	mu      sync.Mutex
	started bool
	closed  bool
	ports   []*port
	conns   map[net.Conn]struct{}

	wg sync.WaitGroup // accept loops, sessions and result deliveries
	// settling counts the worker sessions until their results are settled and their
	// loss reported: Close waits for them, within ShutdownTimeout.
	settling  sync.WaitGroup
	closeOnce sync.Once
	// deliveries runs result deliveries (workerSession.deliver) on reused goroutines.
	deliveries *reuse.Pool

	stats counters // for Stats
}

// New returns a bridge in front of the coordinator reachable on nc, which it does not
// own (Close leaves it open). It listens only once started.
func New(nc *nats.Conn, cfg Config) (*Bridge, error) {
	if nc == nil {
		return nil, errors.New("bridge: nil NATS connection")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Bridge{
		nc: nc, cfg: cfg, log: log,
		ctx: ctx, cancel: cancel,
		requests: make(chan struct{}, cfg.MaxInFlight),
		workers:  registry{live: make(map[string]*workerSession)},
		conns:    make(map[net.Conn]struct{}),
	}
	b.deliveries = reuse.New(ctx.Done(), &b.wg)
	return b, nil
}

// Start listens on the configured ports and serves them until Close. It returns once
// listening; ctx bounds only the start. A port already in use fails with ErrPortInUse
// and a message naming the address, and nothing is left listening.
func (b *Bridge) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return ErrClosed
	case b.started:
		return ErrStarted
	}
	var ports []*port
	for _, spec := range []struct {
		name, addr, flag string
		serve            func(net.Conn, func())
		settles          bool
	}{
		{"worker", b.cfg.WorkerListen, "worker-port", b.serveWorker, true},
		{"client", b.cfg.ClientListen, "client-port", b.serveClient, false},
		{"mu", b.cfg.MuListen, "mu-port", b.serveMu, false},
	} {
		if spec.addr == "" {
			continue
		}
		ln, err := listen(ctx, spec.addr, spec.flag)
		if err != nil {
			for _, p := range ports {
				_ = p.ln.Close()
			}
			return err
		}
		if b.cfg.TLS != nil {
			ln = tls.NewListener(ln, b.cfg.TLS)
		}
		ports = append(ports, &port{name: spec.name, ln: ln, serve: spec.serve, settles: spec.settles})
	}
	// A new leader's announcement makes every session heartbeat now (and so register
	// with the new leader) instead of at its worker's next heartbeat.
	sub, err := b.nc.Subscribe(protocol.LeaderSubject, func(*nats.Msg) { b.workers.heartbeatAll() })
	if err != nil {
		for _, p := range ports {
			_ = p.ln.Close()
		}
		return fmt.Errorf("bridge: subscribe %s: %w", protocol.LeaderSubject, err)
	}
	b.leaderSub = sub
	b.started = true
	b.ports = ports
	for _, p := range ports {
		b.log.Info("bridge listening", "port", p.name, "addr", p.ln.Addr().String())
		b.wg.Add(1)
		go b.accept(p)
	}
	return nil
}

func listen(ctx context.Context, addr, flag string) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	switch {
	case err == nil:
		return ln, nil
	case isAddrInUse(err):
		return nil, fmt.Errorf("bridge: listen %s: %w (pass --%s)", addr, ErrPortInUse, flag)
	}
	return nil, fmt.Errorf("bridge: listen %s: %w", addr, err)
}

func isAddrInUse(err error) bool {
	// WSAEADDRINUSE on Windows is not syscall.EADDRINUSE; its text is stable.
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "Only one usage of each socket address")
}

// WorkerAddr is the worker port's address once started, nil if disabled.
func (b *Bridge) WorkerAddr() net.Addr { return b.addr("worker") }

// ClientAddr is the client port's address once started, nil if disabled.
func (b *Bridge) ClientAddr() net.Addr { return b.addr("client") }

func (b *Bridge) addr(name string) net.Addr {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.ports {
		if p.name == name {
			return p.ln.Addr()
		}
	}
	return nil
}

// Close stops the bridge gracefully: it stops listening and closes every connection,
// so that no new connection or frame is read; then it gives the TASK_RESULTs already
// read up to ShutdownTimeout to be answered by the coordinator (a relay that is slow
// because no coordinator serves for a moment, a failover or a restart beside it, still
// completes), and each worker's loss is reported once its results are settled. What is
// still undelivered then is abandoned. Close waits for every goroutine of the bridge,
// is idempotent and leaves the NATS connection open.
func (b *Bridge) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closed = true
		ports := b.ports
		conns := make([]net.Conn, 0, len(b.conns))
		for c := range b.conns {
			conns = append(conns, c)
		}
		b.mu.Unlock()
		if b.leaderSub != nil {
			_ = b.leaderSub.Unsubscribe()
		}
		for _, p := range ports {
			_ = p.ln.Close()
		}
		for _, c := range conns {
			_ = c.Close()
		}
		b.settle()
		b.wg.Wait()
	})
	return nil
}

// settle waits until every worker session has settled the results it read, within
// ShutdownTimeout, and then ends the bridge's context: whatever is still being
// delivered, or asked, is abandoned.
func (b *Bridge) settle() {
	settled := make(chan struct{})
	go func() {
		b.settling.Wait()
		close(settled)
	}()
	timeout := time.NewTimer(b.cfg.ShutdownTimeout)
	defer timeout.Stop()
	select {
	case <-settled:
	case <-timeout.C:
		b.log.Warn("bridge shutdown timeout: undelivered results abandoned", "timeout", b.cfg.ShutdownTimeout)
	}
	b.cancel()
	<-settled
}
