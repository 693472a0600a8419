// Package coordinator runs the job lifecycle of PROTOCOL.md on NATS: validation,
// admission, idempotency, priority with aging, the worker registry, leases, deadlines,
// retries, cancellation and recovery. It is the only writer of job state, which lives in
// JetStream KV; it serves clients through the `jobbus` micro service and workers through
// the bus.
//
// A Coordinator is built from parts that each own their state (see Coordinator): the
// scheduler owns jobs and workers under one mutex with short critical sections (every
// decision is made in memory, messages are sent after the mutex is released) and hands
// changed records to the store (jobstore.go), which writes them its way, one write in
// flight per job, each a CAS on the revision the last returned. A reply that promises
// durability (JOB_SUBMITTED, a result's acknowledgement, JOB_CANCEL) is sent only when
// the write carrying it is durable.
package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// Coordinator is one running coordinator. It composes parts that each own their state
// and say so in their doc comments:
//
//   - scheduler (scheduler.go): jobs and workers, under its one mutex;
//   - store (jobstore.go): every durable write and read of job records, and the term;
//   - api (api.go): the bus node and the micro service that serve the scheduler;
//   - lease (leaseclock.go): whether the leader lease is certainly held (Run's elector,
//     leader.go, renews it);
//   - sweeper (sweeper.go): the ticker that runs the scheduler's sweep;
//   - the scheduler's timers (timers.go): the driver that wakes what is due;
//   - checkpointer (checkpoint.go): checkpoints of the job index;
//   - catalogue (catalogue.go): the task types workers declared.
//
// The Coordinator starts them in order and stops them in the reverse.
type Coordinator struct {
	cfg Config
	log *slog.Logger
	nc  *nats.Conn

	store  jobStore
	opened bool   // the store is open and written by the scheduler's committer
	term   uint64 // this coordinator's leadership term (batch.go); set before recovery

	sched *scheduler
	api   *api
	ckpt  *checkpointer
	cat   *catalogue
	lease leaseClock

	cancel context.CancelFunc
	wg     sync.WaitGroup // the goroutines of the scheduler and the sweeper
	closed sync.Once
}

// workerLink sends to workers: the bus node, or a test's stand-in.
type workerLink interface {
	Tell(ctx context.Context, to bus.Address, path string, msg any) error
}

// New builds a coordinator on an existing NATS connection, which it does not own.
func New(nc *nats.Conn, cfg Config) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("coordinator config: %w", err)
	}
	cfg.fill()
	c := &Coordinator{cfg: cfg}
	var store jobStore = newJetStreamStore(nc, &c.cfg)
	if cfg.SyncJobs != nil {
		store = newSyncedStore(store, cfg.SyncJobs, &c.cfg)
	}
	c.build(nc, store)
	return c, nil
}

// build makes c's parts, over store; c.cfg is valid and filled.
func (c *Coordinator) build(nc *nats.Conn, store jobStore) {
	c.log, c.nc, c.store = c.cfg.Logger, nc, store
	c.lease = leaseClock{base: time.Now()}
	c.cat = newCatalogue(c.cfg.TaskTypes, c.cfg.Logger)
	c.sched = newScheduler(c)
	c.ckpt = &checkpointer{store: store, log: c.log, index: c.sched.indexCopy}
	c.sched.ckpt = c.ckpt
	c.api = &api{cfg: &c.cfg, nc: nc, log: c.log, sched: c.sched, reg: c.sched.reg, lease: &c.lease, store: store}
}

// Start opens the buckets, rebuilds state from them, and only then serves workers and
// clients. It returns once serving; Close stops it.
func (c *Coordinator) Start(ctx context.Context) error {
	runCtx, err := c.open(ctx)
	if err != nil {
		return err
	}
	// The schedules' due ticks are submitted once recovery has bound every key.
	if err := c.sched.sch.start(ctx); err != nil {
		c.Close()
		return fmt.Errorf("coordinator: %w", err)
	}
	// What recovery found, read before serving: the first requests change it.
	recovered := append(c.sched.recovered(), "term", c.term)
	if err := c.api.serve(); err != nil {
		c.Close()
		return fmt.Errorf("coordinator: %w", err)
	}
	// The server has every subscription once a round trip is done: from then on,
	// requests on any connection reach this coordinator.
	if err := c.nc.FlushTimeout(5 * time.Second); err != nil {
		c.Close()
		return fmt.Errorf("coordinator: flush subscriptions: %w", err)
	}
	c.ckpt.begin(runCtx) // from now on, writes may start checkpoints
	sw := sweeper{every: c.cfg.SweepInterval, sweep: c.sched.sweep}
	c.goRun(func() { sw.run(runCtx) })
	c.goRun(func() { c.sched.timers.run(runCtx, c.cfg.SweepInterval) })
	c.log.Info("coordinator serving", recovered...)
	hello, _ := json.Marshal(protocol.LeaderAnnouncement{Coordinator: c.cfg.ID, Term: c.term})
	_ = c.nc.Publish(protocol.LeaderSubject, hello) // best effort: heartbeats find it anyway
	return nil
}

// open opens the store and the catalogue, starts writing and recovers: everything
// Start does before it serves. The context it returns ends when the coordinator stops.
func (c *Coordinator) open(ctx context.Context) (context.Context, error) {
	if err := c.store.open(ctx); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	_, c.term = c.store.terms()
	if c.nc != nil {
		if err := c.cat.open(ctx, c.nc, c.cfg.Replicas); err != nil {
			return nil, fmt.Errorf("coordinator: %w", err)
		}
		openLogs(ctx, c.nc, &c.cfg) // joblogs.go
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.sched.life = runCtx
	if err := c.store.start(runCtx, c.sched); err != nil {
		cancel()
		c.store.wait()
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	c.opened = true
	c.goRun(func() { c.sched.committer(runCtx) })
	// Queue settings first: a queue paused stays paused from the first job recovered.
	if err := c.sched.loadQueues(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	if err := c.sched.recover(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("coordinator: recover: %w", err)
	}
	return runCtx, nil
}

// Close stops serving and waits for in-flight writes to end. It is idempotent.
func (c *Coordinator) Close() error {
	c.closed.Do(func() {
		c.api.stop()
		c.sched.sch.stop()
		c.sched.follows.stop()
		if c.cancel != nil {
			c.sched.drainWrites(2 * time.Second)
		}
		c.ckpt.final(c.opened && c.sched.fencedBy() == nil && c.lease.held())
		if c.cancel != nil {
			c.cancel()
		}
		c.wg.Wait()
		c.ckpt.wait()
		if c.opened {
			c.store.wait()
		}
	})
	return nil
}

func (c *Coordinator) goRun(fn func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		fn()
	}()
}

// Term is this coordinator's leadership term: 1 for the first leader of a store, one
// more for each after it.
func (c *Coordinator) Term() uint64 { return c.term }

// Fenced is closed once the coordinator finds that another one wrote the state it
// believed it owned. It then serves nothing: replace it by one that recovers from KV,
// as Run does.
func (c *Coordinator) Fenced() <-chan struct{} { return c.sched.fencedCh }

// ErrNotServing is returned by requests to a coordinator that is fenced or stopping.
var ErrNotServing = errors.New(protocol.NotServingPrefix)
