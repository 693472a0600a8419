// Package system is jobbus's one assembly: it builds a whole system from one Config
// and owns it until Close. The parts are NATS (a server embedded in this process, or
// one joined at a URL), the coordinator, campaigning for leadership as every
// coordinator does (coordinator.Run), the bridge's TCP ports, the HTTP listener
// (dashboard, Prometheus /metrics, /healthz, /readyz) and local native workers. Each
// part but NATS is optional, so `jobbus serve`, `coordinator`, `bridge`, `dashboard`
// and `bench`, the test systems and fillstore are this one assembly with different
// parts on, and bench measures what serve runs.
//
// The parts start in the order NATS, HTTP, bridge, coordinator, workers, except that
// the HTTP listener opens before NATS, answering /healthz (and /readyz: not ready)
// while the system waits for NATS or its store. They stop as
// serve always stopped: the coordinator and the workers are told to stop at once (a
// drain before Close lets the workers' running jobs finish while the coordinator is
// still there to take their results), then the rest in the reverse order of the start,
// NATS last; except that the bridge closes first, delivering the TCP workers' results
// it already read while the coordinator still runs.
package system

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/memreturn"
	"github.com/jobbus/jobbus/system/internal/httpserver"
	"github.com/jobbus/jobbus/system/internal/metrics"
	"github.com/jobbus/jobbus/worker"
)

// DefaultHTTPListen is where `jobbus serve` serves HTTP: loopback, beside NATS (4222)
// and the TCP ports (7070, 7071).
const DefaultHTTPListen = httpserver.DefaultListen

// ErrNoCoordinator: Leading on a system that runs no coordinator.
var ErrNoCoordinator = errors.New("system: no coordinator in this system")

// Config is a whole system. NATS is always there; every other part is off at its
// zero value.
type Config struct {
	// NATS is where the system's NATS is: embedded, or joined at a URL.
	NATS NATS
	// Coordinator, if set, runs a coordinator that campaigns for leadership and
	// coordinates while it leads, as coordinator.Run does. The system fills in what
	// is its own to give: Observer (with Metrics) and, on an embedded server,
	// StoreFault, StoreLimit (when 0), SyncJobs (with NATS.SyncJobs) and, when empty,
	// ID (kept in the store directory, so that a restarted process takes its lease
	// back at once).
	Coordinator *coordinator.Config
	// Bridge, if set, serves the TCP ports of PROTOCOL.md in front of the coordinator.
	Bridge *bridge.Config
	// HTTPListen is the address of the HTTP listener: the dashboard at /, /metrics,
	// /healthz and /readyz; "" leaves it off.
	HTTPListen string
	// Metrics collects the Prometheus metrics of every part: the coordinator's job
	// lifecycle, the bridge's connections, the bus counters of the workers. They are
	// served at /metrics, and MetricsHandler serves them too.
	Metrics bool
	// Workers are the local native workers.
	Workers Workers
	// Logger receives what the system says; nil discards it. The parts' own
	// configurations name their loggers.
	Logger *slog.Logger
	// ReturnIdleMemory gives the heap memory a burst of work left behind back to the
	// operating system once the process is idle (internal/memreturn), as serve and
	// coordinator do. It acts on the whole process: leave it off where the system is
	// a library's part.
	ReturnIdleMemory bool
}

// NATS is where a system's NATS is.
type NATS struct {
	// URL joins the NATS server (or servers, comma-separated) there, waiting until
	// one and its JetStream answer, and reconnecting for as long as the system runs.
	// "" starts a server in this process.
	URL string
	// Options apply to every connection the system opens (credentials, TLS).
	Options []nats.Option
	// Name names the system's connections in the server's monitoring (default
	// "jobbus").
	Name string

	// The embedded server's settings; with a URL they must be left empty.

	// Server are the embedded server's options. The system adds WithStoreDir.
	Server []embeddednats.Option
	// StoreDir is the embedded server's JetStream store; "" is a temporary directory
	// that Close removes.
	StoreDir string
	// WaitForStore makes Start wait, saying so now and then, while the store cannot
	// be written (a read-only file system, a full disk), instead of failing: a
	// service that waits for its disk as it would for its NATS server.
	WaitForStore bool
	// SyncJobs makes the coordinator fsync the jobs stream itself, a group of writes
	// at a time, before anything depends on them (embeddednats.StreamSync): `serve
	// --sync always` on a lone server, whose JetStream then need not sync each write.
	SyncJobs bool
	// AnswerServers answers `jobbus cluster` for the embedded server: its name,
	// routes, leaf nodes and, on the JetStream meta leader, its peers' currency.
	AnswerServers bool
}

// Workers are a system's local native workers.
type Workers struct {
	// Count is how many to run.
	Count int
	// Options, if set, gives each worker its options; it is called once per worker,
	// so that each may get something of its own (a task registry that Setup adds
	// to). The system puts a heartbeat first, often enough for its coordinator's
	// heartbeat timeout however short that is set; the options may override it.
	Options func() []worker.Option
	// Dial gives each worker a NATS connection of its own, over TCP even to an
	// embedded server, as a worker in another process has; otherwise the workers
	// share the system's connection.
	Dial bool
	// Setup, if set, is called on each worker before it runs (worker.Handle,
	// worker.HandleJSON).
	Setup func(*worker.Worker) error
}

// System is a running system. Its methods may be called from any goroutine.
type System struct {
	cfg Config
	log *slog.Logger

	srv *embeddednats.Server
	nc  *nats.Conn
	url string // the client URL the workers that dial use
	dir string // the embedded server's store directory
	reg *metrics.Registry
	web *httpserver.Server
	br  *bridge.Bridge

	base    context.Context    // Start's values, not its end
	run     context.Context    // the coordinator's and the workers' runs
	stopRun context.CancelFunc // ends run: Close's first step
	workers []*worker.Worker
	stops   []func() // what Close undoes, in the order it was started

	coordDone chan struct{} // closed when coordinator.Run returned, or never without one
	coordErr  error         // what it returned; read after coordDone

	leadMu sync.Mutex
	leader *coordinator.Coordinator // the one leading, or that led last
	led    chan struct{}            // closed when this system's coordinator first leads

	closeOnce sync.Once
}

// Start builds and starts the system of cfg. ctx bounds the start only (waiting for
// NATS, or for the store with WaitForStore); Close stops the system. On an error,
// what was started is stopped again.
func Start(ctx context.Context, cfg Config) (*System, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.NATS.Name == "" {
		cfg.NATS.Name = "jobbus"
	}
	s := &System{cfg: cfg, log: log, base: context.WithoutCancel(ctx), coordDone: make(chan struct{}), led: make(chan struct{})}
	s.run, s.stopRun = context.WithCancel(s.base)
	if err := s.start(ctx); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// check refuses a configuration that cannot be built.
func (c Config) check() error {
	var errs []error
	if c.NATS.URL != "" && (len(c.NATS.Server) > 0 || c.NATS.StoreDir != "" || c.NATS.WaitForStore || c.NATS.SyncJobs || c.NATS.AnswerServers) {
		errs = append(errs, errors.New("system: the embedded server's settings with a NATS URL: no server is embedded"))
	}
	if c.NATS.SyncJobs && c.Coordinator == nil {
		errs = append(errs, errors.New("system: NATS.SyncJobs without a coordinator"))
	}
	if c.Workers.Count < 0 {
		errs = append(errs, fmt.Errorf("system: Workers.Count must be 0 or more, got %d", c.Workers.Count))
	}
	if c.Coordinator != nil {
		if err := c.Coordinator.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Bridge != nil {
		if err := c.Bridge.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *System) start(ctx context.Context) error {
	if err := s.listenHTTP(ctx); err != nil {
		return err
	}
	if err := s.startNATS(ctx); err != nil { // nats.go
		return err
	}
	if s.cfg.ReturnIdleMemory {
		s.onStop(memreturn.Start(memreturn.Config{Logger: s.log}))
	}
	if s.cfg.Metrics {
		s.reg = metrics.New()
	}
	if err := s.startHTTP(); err != nil {
		return err
	}
	if err := s.startBridge(ctx); err != nil {
		return err
	}
	if err := s.startCoordinator(); err != nil {
		return err
	}
	return s.startWorkers(ctx)
}

// onStop adds what Close undoes, after everything started before it.
func (s *System) onStop(f func()) { s.stops = append(s.stops, f) }

// stop closes the bridge, then ends the coordinator's and the workers' runs, then
// undoes the start, the part started last first. The bridge goes first, out of that
// order: its Close delivers the TCP workers' results it already read (bridge.Config's
// ShutdownTimeout), and this system's coordinator must still be there to take them.
func (s *System) stop() {
	if s.br != nil {
		_ = s.br.Close() // idempotent: its own stop, later, does nothing
	}
	s.stopRun()
	for _, f := range slices.Backward(s.stops) {
		f()
	}
}

// listenHTTP opens the HTTP listener first: while the system waits for its NATS (or
// its store) at start-up, /healthz answers and /readyz says why it is not ready, so
// that a liveness probe does not restart a process that only waits. startHTTP serves
// the rest on it once NATS is there (mountHTTP, http.go).
func (s *System) listenHTTP(ctx context.Context) error {
	if s.cfg.HTTPListen == "" {
		return nil
	}
	web, err := httpserver.Listen(ctx, s.cfg.HTTPListen, s.log)
	if err != nil {
		return err
	}
	s.web = web
	s.onStop(func() { _ = web.Close() }) // should NATS never come
	return nil
}

func (s *System) startHTTP() error {
	if s.web == nil {
		return nil
	}
	stop, err := mountHTTP(s.web, s.cfg.HTTPListen, s.nc, s.log, s.MetricsHandler())
	if err != nil {
		return err
	}
	s.onStop(stop)
	return nil
}

func (s *System) startCoordinator() error {
	if s.cfg.Coordinator == nil {
		return nil
	}
	cfg := *s.cfg.Coordinator
	if s.srv != nil {
		cfg.StoreFault = s.srv.StoreFault // the store guard tells the coordinator of a failed disk
		if jsc := s.srv.NATS().JetStreamConfig(); jsc != nil && cfg.StoreLimit == 0 {
			// The cap it took (--nats-max-store, or 75% of the disk's free space): the
			// coordinator keeps the jobs under it, and room for its lease.
			cfg.StoreLimit = jsc.MaxStore
		}
		if s.cfg.NATS.SyncJobs {
			cfg.SyncJobs = s.srv.StreamSync(s.nc, jobsStream).Sync
		}
		if cfg.ID == "" {
			// The embedded store is locked to this process, so an identity kept in it is
			// this process's alone: after a crash, the coordinator takes its lease back.
			id, err := storedCoordinatorID(s.storeDir()) // identity.go
			if err != nil {
				return err
			}
			cfg.ID = id
		}
	}
	var observe func(*coordinator.Coordinator)
	if s.reg != nil {
		cfg.Observer = s.reg.Coordinator()
		observe = s.reg.Coordinator().OnLead
	}
	go func() {
		defer close(s.coordDone)
		s.coordErr = coordinator.Run(s.run, s.nc, cfg, func(c *coordinator.Coordinator) {
			if observe != nil {
				observe(c)
			}
			s.leadMu.Lock()
			first := s.leader == nil
			s.leader = c
			s.leadMu.Unlock()
			if first {
				close(s.led)
			}
		})
	}()
	s.onStop(func() { <-s.coordDone })
	return nil
}

func (s *System) startBridge(ctx context.Context) error {
	if s.cfg.Bridge == nil {
		return nil
	}
	br, err := bridge.New(s.bridgeConn(ctx), *s.cfg.Bridge)
	if err != nil {
		return err
	}
	if err := br.Start(ctx); err != nil {
		return err
	}
	s.br = br
	s.onStop(func() { _ = br.Close() })
	if s.reg != nil {
		s.reg.AddBridge(br)
	}
	return nil
}

// bridgeConn is the connection the bridge uses. Joined at a URL, that is one of its
// own with bridgeNATSOptions when the system's connection serves other parts too;
// should that dial fail, the bridge shares the system's, and still answers at once
// while that one is down. An embedded server's in-process connection never
// reconnects, so the bridge shares it.
func (s *System) bridgeConn(ctx context.Context) *nats.Conn {
	if !s.bridgeOwnConn() {
		return s.nc
	}
	own, err := s.dial(ctx, bridgeNATSOptions()...)
	if err != nil {
		s.log.Warn("bridge: a NATS connection of its own failed; sharing serve's", "err", err)
		return s.nc
	}
	s.onStop(own.Close)
	return own
}

// bridgeOwnConn reports whether the bridge gets a connection of its own; a bridge
// alone on a joined NATS gets bridgeNATSOptions on the system's (startNATS).
func (s *System) bridgeOwnConn() bool {
	return s.cfg.NATS.URL != "" && s.cfg.Bridge != nil && (s.cfg.Coordinator != nil || s.cfg.Workers.Count > 0)
}

// bridgeNATSOptions are the options of a bridge's NATS connection: while it
// reconnects, a publish fails instead of waiting in a buffer, so a client request the
// bridge has answered "unavailable" is never sent to the coordinator after all.
func bridgeNATSOptions() []nats.Option {
	return []nats.Option{nats.ReconnectBufSize(-1)}
}

func (s *System) startWorkers(ctx context.Context) error {
	w := s.cfg.Workers
	if w.Count == 0 {
		return nil
	}
	var base []worker.Option
	if c := s.cfg.Coordinator; c != nil && c.HeartbeatTimeout > 0 {
		// Local workers beat often enough for the coordinator they serve, however
		// short its heartbeat timeout is set.
		base = append(base, worker.WithHeartbeat(min(worker.DefaultHeartbeat, c.HeartbeatTimeout/3)))
	}
	for range w.Count {
		opts := slices.Clone(base)
		if w.Options != nil {
			opts = append(opts, w.Options()...)
		}
		wk, err := s.newWorker(ctx, opts)
		if err != nil {
			return fmt.Errorf("local worker: %w", err)
		}
		if w.Setup != nil {
			if err := w.Setup(wk); err != nil {
				_ = wk.Close()
				return fmt.Errorf("local worker: %w", err)
			}
		}
		s.workers = append(s.workers, wk)
		if s.reg != nil {
			s.reg.AddBus("worker", wk.BusStats)
		}
	}
	var wg sync.WaitGroup
	for _, wk := range s.workers {
		wg.Go(func() {
			defer wk.Close()
			if err := wk.Run(s.run); err != nil && !errors.Is(err, context.Canceled) {
				s.log.Error("local worker stopped", "worker", wk.ID(), "err", err)
			}
		})
	}
	s.onStop(wg.Wait)
	return nil
}

func (s *System) newWorker(ctx context.Context, opts []worker.Option) (*worker.Worker, error) {
	if !s.cfg.Workers.Dial {
		return worker.New(s.nc, opts...)
	}
	busOpts := append(embeddednats.ServiceOptions(), s.cfg.NATS.Options...)
	return worker.Connect(ctx, s.url, append(opts, worker.WithBusOptions(bus.WithNATSOptions(busOpts...)))...)
}

// Close stops the system: the bridge, once the TCP workers' results it read are
// delivered (within its ShutdownTimeout), then the workers and the coordinator at once
// (drain the workers first with Drain to let their running jobs finish; the
// coordinator gives its lease up), then the HTTP listener, the connections and the
// embedded server (and its temporary store). It is idempotent, and returns the
// coordinator's error if it stopped on one.
func (s *System) Close() error {
	s.closeOnce.Do(s.stop)
	select {
	case <-s.coordDone:
		return s.coordErr
	default:
		return nil // no coordinator
	}
}

// Done is closed when the system's coordinator stopped by itself, on an error that
// Close returns; never, without a coordinator, until Close.
func (s *System) Done() <-chan struct{} { return s.coordDone }

// Leading waits until this system's coordinator leads and returns it (after a
// failover, the one leading now, or that led last). It fails at once without a
// coordinator, and when the coordinator stopped before it led.
func (s *System) Leading(ctx context.Context) (*coordinator.Coordinator, error) {
	if s.cfg.Coordinator == nil {
		return nil, ErrNoCoordinator
	}
	select {
	case <-s.led:
	case <-s.coordDone:
		if err := s.coordErr; err != nil {
			return nil, err
		}
		return nil, errors.New("system: the coordinator stopped before it led")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.leadMu.Lock()
	defer s.leadMu.Unlock()
	return s.leader, nil
}

// Drain drains every local worker at once: they take no new job, and Drain returns
// once their running jobs finished, or with ctx's error when it ends first.
func (s *System) Drain(ctx context.Context) error {
	errs := make([]error, len(s.workers))
	var wg sync.WaitGroup
	for i, w := range s.workers {
		wg.Go(func() { errs[i] = w.Drain(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Conn is the system's NATS connection.
func (s *System) Conn() *nats.Conn { return s.nc }

// Server is the embedded NATS server, nil when the system joined one at a URL.
func (s *System) Server() *embeddednats.Server { return s.srv }

// ClientURL is the URL a NATS client of this system dials: the embedded server's,
// or the URL joined.
func (s *System) ClientURL() string { return s.url }

// StoreDir is the embedded server's store, "" when the system joined NATS at a URL.
func (s *System) StoreDir() string {
	if s.srv == nil {
		return ""
	}
	return s.storeDir()
}

// Bridge is the system's bridge, nil without one.
func (s *System) Bridge() *bridge.Bridge { return s.br }

// HTTPAddr is the address the HTTP listener listens on, nil when it is off.
func (s *System) HTTPAddr() net.Addr {
	if s.web == nil {
		return nil
	}
	return s.web.Addr()
}

// MetricsHandler serves the system's metrics in the Prometheus exposition formats,
// as /metrics does; nil without Metrics.
func (s *System) MetricsHandler() http.Handler {
	if s.reg == nil {
		return nil
	}
	return s.reg.Handler()
}
