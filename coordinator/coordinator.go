// Package coordinator runs the job lifecycle of PROTOCOL.md on NATS: validation,
// admission, idempotency, priority with aging, the worker registry, leases, deadlines,
// retries, cancellation and recovery. It is the only writer of job state, which lives in
// JetStream KV; it serves clients through the `jobbus` micro service and workers through
// the bus.
//
// State is owned by one mutex (Coordinator.mu) with short critical sections: every
// decision is made in memory, messages are sent after the mutex is released, and records reach KV through a pipeline of writers (one
// write in flight per job, each a CAS on the revision the last returned). A reply that
// promises durability (JOB_SUBMITTED, a result's acknowledgement, JOB_CANCEL) is sent
// only when the write carrying it is acknowledged.
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
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// Coordinator is one running coordinator.
type Coordinator struct {
	cfg  Config
	log  *slog.Logger
	node *bus.Node
	nc   *nats.Conn

	js       jetstream.JetStream
	jobsKV   jetstream.KeyValue
	stream   jetstream.Stream // the jobs bucket's
	svc      micro.Service
	ckpt     jetstream.ObjectStore // checkpoints of the job index (checkpoint.go)
	runCtx   context.Context       // ends when the coordinator stops
	prevTerm uint64                // the term before this one, whose checkpoint recovery may use
	term     uint64                // this coordinator's leadership term (batch.go); set before recovery
	termSeq  uint64                // the stream sequence of its TermKey write, which every batch checks

	mu              sync.Mutex
	jobs            map[string]*job    // active, and finished until their record is durable
	index           jobIndex           // every kept job by sequence (retained.go)
	keys            map[string]*job    // idempotency keys of the jobs in jobs
	doneKeys        map[string]doneKey // idempotency keys of finished jobs, until they expire
	expiring        []expiring         // finished jobs by the end of their retention, from expHead
	expHead         int
	recent          []uint64 // sequences of the jobs that finished last (retained.go)
	recentNext      int
	workers         map[string]*worker
	cat             *catalogue     // task types (catalogue.go); its own lock
	typeRuns        map[string]int // RUNNING jobs by task type (routing.go)
	ready           *readyQueue
	retries         timerHeap
	deadlines       deadlineHeap
	active          int
	seq             uint64
	lastMilli       int64 // createdAt never goes backwards, so sequence order is age order
	dirty           []*job
	writes          int // jobs queued for or held by a writer
	fenced          error
	sinceCheckpoint int        // durable writes since the last checkpoint
	checkpointing   bool       // a checkpoint is being written
	outbox          []outgoing // to send once mu is released (outbox.go)

	sendMu sync.Mutex // held while sending the outbox, so messages leave in order

	lease leaseClock // whether the leader lease is certainly held (leaseclock.go)
	off   offline    // the sweeper's view of the connection (offline.go); guarded by mu
	// unclaimed: attempts running before recovery, until their workers claim them
	// (recover.go); guarded by mu.
	unclaimed unclaimed

	fencedCh chan struct{} // closed with fenced set
	wake     chan struct{}
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	closed   sync.Once

	// storage: whether the store had room at the last job write (storage.go).
	storage storeHealth
	durable *groupSync // nil unless Config.SyncJobs: writes are then recorded once synced
}

// New builds a coordinator on an existing NATS connection, which it does not own.
func New(nc *nats.Conn, cfg Config) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("coordinator config: %w", err)
	}
	cfg.fill()
	return &Coordinator{
		cfg:      cfg,
		log:      cfg.Logger,
		nc:       nc,
		jobs:     make(map[string]*job),
		keys:     make(map[string]*job),
		doneKeys: make(map[string]doneKey),
		workers:  make(map[string]*worker),
		cat:      newCatalogue(cfg.TaskTypes, cfg.Logger),
		typeRuns: make(map[string]int),
		ready:    newReadyQueue(),
		lease:    leaseClock{base: time.Now()},
		fencedCh: make(chan struct{}),
		wake:     make(chan struct{}, 1),
		storage:  storeHealth{fault: cfg.StoreFault},
		durable:  newGroupSync(cfg.SyncJobs),
	}, nil
}

// Start opens the buckets, rebuilds state from them, and only then serves workers and
// clients. It returns once serving; Close stops it.
func (c *Coordinator) Start(ctx context.Context) error {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return fmt.Errorf("coordinator: jetstream: %w", err)
	}
	c.js = js
	if c.jobsKV, c.stream, err = openBuckets(ctx, c.nc, js, &c.cfg); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if c.ckpt, err = openCheckpoints(ctx, js, c.cfg.Replicas); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if err := c.claimTerm(ctx); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if err := c.openCatalogue(ctx); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	var p *pipeline
	if !c.batching() {
		if p, err = c.startPipeline(runCtx); err != nil {
			cancel()
			return fmt.Errorf("coordinator: %w", err)
		}
	}
	c.goRun(func() { c.committer(runCtx, p) })
	if c.durable != nil {
		c.goRun(func() { c.syncer(runCtx) })
	}
	if err := c.recover(ctx); err != nil {
		c.Close()
		return fmt.Errorf("coordinator: recover: %w", err)
	}
	// What recovery found, read before serving: the first requests change it.
	c.mu.Lock()
	recovered := []any{"jobs", len(c.jobs), "active", c.active, "next_seq", c.seq + 1, "term", c.term}
	c.unlock()
	if err := c.serve(); err != nil {
		c.Close()
		return fmt.Errorf("coordinator: %w", err)
	}
	// The server has every subscription once a round trip is done: from then on,
	// requests on any connection reach this coordinator.
	if err := c.nc.FlushTimeout(5 * time.Second); err != nil {
		c.Close()
		return fmt.Errorf("coordinator: flush subscriptions: %w", err)
	}
	c.mu.Lock()
	c.runCtx = runCtx // from now on, writes may start checkpoints
	c.unlock()
	c.goRun(func() { c.sweeper(runCtx) })
	c.log.Info("coordinator serving", recovered...)
	hello, _ := json.Marshal(protocol.LeaderAnnouncement{Coordinator: c.cfg.ID, Term: c.term})
	_ = c.nc.Publish(protocol.LeaderSubject, hello) // best effort: heartbeats find it anyway
	return nil
}

// Close stops serving and waits for in-flight writes to end. It is idempotent.
func (c *Coordinator) Close() error {
	c.closed.Do(func() {
		c.stopServing()
		c.drainWrites(2 * time.Second)
		c.finalCheckpoint()
		if c.cancel != nil {
			c.cancel()
		}
		c.wg.Wait()
	})
	return nil
}

// drainWrites gives queued writes a moment to land before the writers stop, so a
// graceful stop leaves nothing for recovery to redo.
func (c *Coordinator) drainWrites(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		busy := c.writes > 0
		c.unlock()
		if !busy || c.cancel == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *Coordinator) goRun(fn func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		fn()
	}()
}

func (c *Coordinator) now() time.Time { return c.cfg.Now() }

// Fenced is closed once the coordinator finds that another one wrote the state it
// believed it owned. It then serves nothing: replace it by one that recovers from KV,
// as Run does.
func (c *Coordinator) Fenced() <-chan struct{} { return c.fencedCh }

// fence stops this coordinator from changing state after another one wrote it.
func (c *Coordinator) fence(err error) {
	c.mu.Lock()
	first := c.fenced == nil
	if first {
		c.fenced = err
		close(c.fencedCh)
	}
	c.unlock()
	if first {
		c.log.Error("coordinator fenced; it stops serving", "err", err)
		c.goRun(c.stopServing)
	}
}

// stopServing withdraws the API and the worker handlers, so that clients and workers
// reach a coordinator whose memory is the truth, or none.
func (c *Coordinator) stopServing() {
	c.mu.Lock()
	svc, node := c.svc, c.node
	c.unlock()
	if svc != nil {
		_ = svc.Stop()
	}
	if node != nil {
		_ = node.Close()
	}
}

// sweeper releases due retries, enforces deadlines and loses silent workers.
func (c *Coordinator) sweeper(ctx context.Context) {
	t := time.NewTicker(c.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.sweep()
		}
	}
}

// ErrNotServing is returned by requests to a coordinator that is fenced or stopping.
var ErrNotServing = errors.New("coordinator is not serving")

func (c *Coordinator) refuse() *protocol.Error {
	return &protocol.Error{Message: fmt.Sprintf("%v: %v", ErrNotServing, c.fenced)}
}
