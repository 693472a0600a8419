// Package jobbustest is the in-process jobbus system the test suites share, as
// net/http/httptest is for HTTP: an embedded NATS server on a free loopback port with
// its store in a temporary directory and a connection to it (system.Start, as serve
// builds them), a coordinator with millisecond timings, and on demand bridges and
// native workers. Everything it starts stops when the test ends.
package jobbustest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/system"
	"github.com/jobbus/jobbus/worker"
)

// workerHeartbeat is how often the workers of StartNativeWorker heartbeat: what a
// heartbeat carries (the attempts a worker holds) reaches the coordinator within
// milliseconds.
const workerHeartbeat = 50 * time.Millisecond

// FastCoordinatorConfig is the coordinator's reference defaults scaled to milliseconds,
// but for the heartbeat timeout: a minute, so that a worker is lost only by what a
// test does to it (its goodbye, its connection closed, a clock the test moves), or to
// a short timeout the test sets itself. At 400 ms (eight heartbeats) a stall of a
// process under -race on two loaded cores outlasted it now and then: the sweeper lost
// a worker whose heartbeat had not been read yet, and its attempt with it, and a test
// counting attempts or spans found one too many. A minute, not seconds: a test that
// does rely on a silent worker's loss without saying so fails at once rather than now
// and then.
func FastCoordinatorConfig() coordinator.Config {
	cfg := coordinator.DefaultConfig()
	cfg.HeartbeatTimeout = time.Minute
	cfg.SweepInterval = 10 * time.Millisecond
	cfg.TaskTimeout = 10 * time.Second
	cfg.RetryBaseDelay = 10 * time.Millisecond
	cfg.RetryMaxDelay = 40 * time.Millisecond
	cfg.Writers = 8 // a test's load is small
	return cfg
}

// System is a running in-process jobbus system.
type System struct {
	Server *embeddednats.Server
	// NC is a connection to Server, for clients and bridges of the test.
	NC *nats.Conn
	// Config is the coordinator's configuration, also for the next StartCoordinator.
	Config coordinator.Config
	// Coordinator is the one started last; nil with WithoutCoordinator until
	// StartCoordinator.
	Coordinator *coordinator.Coordinator
}

// Option configures Start.
type Option func(*options)

type options struct {
	config        []func(*coordinator.Config)
	noCoordinator bool
}

// WithCoordinatorConfig changes the coordinator's configuration, which starts as
// FastCoordinatorConfig. Several apply in order.
func WithCoordinatorConfig(mods ...func(*coordinator.Config)) Option {
	return func(o *options) { o.config = append(o.config, mods...) }
}

// WithoutCoordinator starts only NATS: nobody answers the coordinator's API until the
// test calls StartCoordinator.
func WithoutCoordinator() Option {
	return func(o *options) { o.noCoordinator = true }
}

// Start starts a system and stops it when the test ends.
func Start(t testing.TB, opts ...Option) *System {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	// The system's NATS only: the coordinator is a plain one (StartCoordinator), which
	// a test may close, restart or replace with campaigners of its own.
	sys, err := system.Start(context.Background(), system.Config{NATS: system.NATS{
		Server: []embeddednats.Option{embeddednats.WithListen("127.0.0.1:-1")}, StoreDir: t.TempDir(),
	}})
	if err != nil {
		t.Fatalf("jobbustest: start NATS: %v", err)
	}
	t.Cleanup(func() { _ = sys.Close() })
	s := &System{Server: sys.Server(), NC: sys.Conn(), Config: FastCoordinatorConfig()}
	for _, mod := range o.config {
		mod(&s.Config)
	}
	if !o.noCoordinator {
		s.StartCoordinator(t)
	}
	return s
}

// connect opens another connection to the server, closed when the test ends.
func (s *System) connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := s.Server.Connect()
	if err != nil {
		t.Fatalf("jobbustest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// StartCoordinator starts a coordinator with s.Config on s.NC and closes it when the
// test ends.
func (s *System) StartCoordinator(t testing.TB) {
	t.Helper()
	c, err := coordinator.New(s.NC, s.Config)
	if err != nil {
		t.Fatalf("jobbustest: new coordinator: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("jobbustest: start coordinator: %v", err)
	}
	s.Coordinator = c
}

// RestartCoordinator closes the coordinator and starts a new one on the same store,
// after mods change s.Config. The new one knows the jobs and no worker.
func (s *System) RestartCoordinator(t testing.TB, mods ...func(*coordinator.Config)) {
	t.Helper()
	if s.Coordinator != nil {
		_ = s.Coordinator.Close()
	}
	for _, mod := range mods {
		mod(&s.Config)
	}
	s.StartCoordinator(t)
}

// StartBridge starts a bridge on s.NC, both ports on free loopback ports unless mods
// say otherwise, and closes it when the test ends.
func (s *System) StartBridge(t testing.TB, mods ...func(*bridge.Config)) *bridge.Bridge {
	t.Helper()
	cfg := bridge.DefaultConfig()
	cfg.WorkerListen, cfg.ClientListen = "127.0.0.1:0", "127.0.0.1:0"
	for _, mod := range mods {
		mod(&cfg)
	}
	b, err := bridge.New(s.NC, cfg)
	if err != nil {
		t.Fatalf("jobbustest: new bridge: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Start(context.Background()); err != nil {
		t.Fatalf("jobbustest: start bridge: %v", err)
	}
	return b
}

// StartNativeWorker runs a native worker on a connection of its own until stop is
// called or the test ends; stop returns once the worker has closed and may be called
// again. The worker heartbeats every 50 ms and logs nothing unless opts say
// otherwise. StartNativeWorker does not wait for the coordinator to list the worker.
func (s *System) StartNativeWorker(t testing.TB, opts ...worker.Option) (w *worker.Worker, stop func()) {
	t.Helper()
	return s.StartFunctionWorker(t, nil, opts...)
}

// StartFunctionWorker is StartNativeWorker with handle called on the worker before it
// runs, to register the task types of its own (worker.Handle, worker.HandleJSON).
func (s *System) StartFunctionWorker(t testing.TB, handle func(*worker.Worker) error, opts ...worker.Option) (w *worker.Worker, stop func()) {
	t.Helper()
	nc := s.connect(t)
	w, err := worker.New(nc, append([]worker.Option{worker.WithHeartbeat(workerHeartbeat), worker.WithLogger(nil)}, opts...)...)
	if err != nil {
		t.Fatalf("jobbustest: new worker: %v", err)
	}
	if handle != nil {
		if err := handle(w); err != nil {
			_ = w.Close()
			nc.Close()
			t.Fatalf("jobbustest: worker handlers: %v", err)
		}
	}
	stopRun := Go(t, w.Run)
	stop = sync.OnceFunc(func() {
		stopRun()
		_ = w.Close()
		nc.Close()
	})
	t.Cleanup(stop)
	return w, stop
}

// Go calls run in a goroutine until stop is called or the test ends: stop cancels
// run's context and returns once run has. It may be called again. What run returns
// is dropped: a test checks what the stop did, not how run ended.
func Go(t testing.TB, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = run(ctx)
	}()
	stop = sync.OnceFunc(func() {
		cancel()
		<-done
	})
	t.Cleanup(stop)
	return stop
}

// WorkerListed reports whether the coordinator behind c lists worker id as live; an
// error asking counts as not listed, so Eventually can wait through it.
func WorkerListed(c *client.Client, id string) bool {
	ws, err := c.Workers(context.Background())
	return err == nil && slices.ContainsFunc(ws, func(w protocol.Worker) bool { return w.WorkerID == id })
}
