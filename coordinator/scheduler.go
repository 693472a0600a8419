package coordinator

import (
	"context"
	"fmt"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/tracing"
	"log/slog"
	"sync"
	"time"
)

// scheduler decides what happens to jobs and workers: submissions, admission,
// idempotency, the ready queue and its priorities, assignments and their leases,
// results, retries, deadlines, cancellation, the worker registry and recovery. It owns
// that state under one mutex (mu) with short critical sections: every decision is made
// in memory, messages decided under mu are sent once it is released (outbox.go), and
// the records it changes reach the store through its committer (store.go), which is
// also the sink of the store's outcomes (jobstore.go).
type scheduler struct {
	cfg   *Config // the coordinator's
	log   *slog.Logger
	store jobStore
	cat   *catalogue
	lease *leaseClock
	ckpt  *checkpointer
	run   func(func()) // runs a goroutine the coordinator owns and waits for
	// withdraw stops serving, once fenced.
	withdraw func()

	mu        sync.Mutex
	jobs      map[string]*job // active, and finished until their record is durable
	keys      map[string]*job // idempotency keys of the jobs in jobs
	wq        *writeQueue     // the jobs to write (store.go)
	note      *observer       // tells Config.Observer (observe.go)
	kept      *retention      // every kept job by sequence (retained.go)
	reg       *registry       // the workers (workers.go)
	route     *routing        // by task type (routing.go)
	claims    *claims         // attempts running before recovery, until their workers claim them (claims.go)
	sch       *schedules      // the schedules, under their own locks (schedules.go)
	ready     *readyQueue
	timers    *timers   // every "later": run times, retries, ticks (timers.go)
	delayed   delayed   // SCHEDULED jobs: their count, the cold ones by due time (delayed.go)
	flow      flow      // what limits hold back (flow.go)
	flowWake  time.Time // when a timer looks again at what flow held back; zero if none
	deadlines deadlineHeap
	active    int
	seq       uint64
	lastMilli int64 // createdAt never goes backwards, so sequence order is age order
	fenced    error
	out       outbox         // messages to send once mu is released (outbox.go)
	replies   *replies       // the answers of write requests, due or not (outcome.go)
	link      workerLink     // what TASK_ASSIGN and TASK_CANCEL go through: the bus node, once serving
	deps      dependents     // jobs WAITING for parents (deps.go)
	groups    groups         // workflows and batches (workflow.go)
	tracer    tracing.Tracer // Config.TracerProvider's; off by default (trace.go)

	fencedCh chan struct{} // closed with fenced set
	// life ends when the coordinator stops (Coordinator.open): what the scheduler
	// goes on doing on its own (settleSteps) ends with it.
	life context.Context

	// queueWrites serialises changes of queue settings (queueapi.go), taken before mu.
	queueWrites sync.Mutex
	// follows reads back settings whose write was answered "Outcome unknown" (controls.go).
	follows *follows

	uniq *uniqueIndex // which job holds each unique key (unique.go)
}

func newScheduler(c *Coordinator) *scheduler {
	s := &scheduler{
		cfg: &c.cfg, log: c.log, store: c.store, cat: c.cat, lease: &c.lease, run: c.goRun,
		withdraw: func() { c.api.stop() },
		jobs:     make(map[string]*job),
		keys:     make(map[string]*job),
		ready:    newReadyQueue(),
		fencedCh: make(chan struct{}),
		follows:  newFollows(),
		life:     context.Background(),
		tracer:   tracing.New(c.cfg.TracerProvider),
	}
	s.wq = &writeQueue{s: s, cfg: &c.cfg, wake: make(chan struct{}, 1)}
	s.note = &observer{obs: c.cfg.Observer}
	s.replies = &replies{note: s.note, store: c.store}
	s.kept = &retention{s: s, cfg: &c.cfg, doneKeys: make(map[string]doneKey)}
	s.reg = &registry{s: s, nc: c.nc, workers: make(map[string]*worker)}
	s.claims = &claims{s: s}
	s.timers = newTimers(s)
	s.sch = newSchedules(s)
	s.flow.init(s)
	s.uniq = newUniqueIndex(s)
	s.route = &routing{s: s, cfg: &c.cfg, cat: c.cat, reg: s.reg, typeRuns: make(map[string]int)}
	return s
}

// sendThrough makes link the way to workers, once serving.
func (s *scheduler) sendThrough(link workerLink) {
	s.mu.Lock()
	s.link = link
	s.mu.Unlock()
}

// fencedBy is why this coordinator was fenced; nil while it is not.
func (s *scheduler) fencedBy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fenced
}

// now is the scheduler's clock (Config.Now).
func (s *scheduler) now() time.Time { return s.cfg.Now() }

// fence stops this coordinator from changing state after another one wrote it.
func (s *scheduler) fence(err error) {
	s.mu.Lock()
	first := s.fenced == nil
	if first {
		s.fenced = err
		close(s.fencedCh)
	}
	s.unlock()
	if first {
		s.log.Error("coordinator fenced; it stops serving", "err", err)
		s.run(s.withdraw)
	}
}

func (s *scheduler) refuse() *protocol.Error {
	return &protocol.Error{Message: fmt.Sprintf("%v: %v", ErrNotServing, s.fenced)}
}

// refusing is a fenced coordinator's refusal (refuse), or nil while it is not fenced.
func (s *scheduler) refusing() *protocol.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fenced == nil {
		return nil
	}
	return s.refuse()
}

// drainWrites gives queued writes up to limit to land before the writers stop, so a
// graceful stop leaves nothing for recovery to redo.
func (s *scheduler) drainWrites(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		busy := s.wq.writes > 0
		s.unlock()
		if !busy {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recovered is what recovery found, for the log.
func (s *scheduler) recovered() []any {
	s.mu.Lock()
	defer s.unlock()
	return []any{"jobs", len(s.jobs), "active", s.active, "next_seq", s.seq + 1}
}

// grace gives every worker a heartbeat timeout of grace from now (offline.go).
func (reg *registry) grace() {
	reg.s.mu.Lock()
	defer reg.s.unlock()
	reg.graceWorkers(reg.s.now())
}
