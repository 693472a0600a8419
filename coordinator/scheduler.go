package coordinator

import (
	"fmt"
	"github.com/jobbus/jobbus/bus/protocol"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
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
	nc    *nats.Conn // the coordinator's connection, whose outages the sweeper sees; nil in tests
	store jobStore
	cat   *catalogue
	lease *leaseClock
	ckpt  *checkpointer
	run   func(func()) // runs a goroutine the coordinator owns and waits for
	// withdraw stops serving, once fenced.
	withdraw func()

	mu         sync.Mutex
	jobs       map[string]*job    // active, and finished until their record is durable
	index      jobIndex           // every kept job by sequence (retained.go)
	keys       map[string]*job    // idempotency keys of the jobs in jobs
	doneKeys   map[string]doneKey // idempotency keys of finished jobs, until they expire
	expiring   []expiring         // finished jobs by the end of their retention, from expHead
	expHead    int
	recent     []uint64 // sequences of the jobs that finished last (retained.go)
	recentNext int
	workers    map[string]*worker
	typeRuns   map[string]int // RUNNING jobs by task type (routing.go)
	ready      *readyQueue
	retries    timerHeap
	deadlines  deadlineHeap
	active     int
	seq        uint64
	lastMilli  int64 // createdAt never goes backwards, so sequence order is age order
	dirty      []*job
	writes     int // jobs queued for or held by a writer
	fenced     error
	outbox     []outgoing // to send once mu is released (outbox.go)
	link       workerLink // what TASK_ASSIGN and TASK_CANCEL go through: the bus node, once serving
	off        offline    // the sweeper's view of the connection (offline.go)

	sendMu sync.Mutex // held while sending the outbox, so messages leave in order

	fencedCh chan struct{} // closed with fenced set
	wake     chan struct{} // wakes the committer
}

func newScheduler(c *Coordinator) *scheduler {
	return &scheduler{
		cfg: &c.cfg, log: c.log, nc: c.nc, store: c.store, cat: c.cat, lease: &c.lease, run: c.goRun,
		withdraw: func() { c.api.stop() },
		jobs:     make(map[string]*job),
		keys:     make(map[string]*job),
		doneKeys: make(map[string]doneKey),
		workers:  make(map[string]*worker),
		typeRuns: make(map[string]int),
		ready:    newReadyQueue(),
		fencedCh: make(chan struct{}),
		wake:     make(chan struct{}, 1),
	}
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

// drainWrites gives queued writes up to limit to land before the writers stop, so a
// graceful stop leaves nothing for recovery to redo.
func (s *scheduler) drainWrites(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		busy := s.writes > 0
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

// jobCounts counts the jobs in memory by state.
func (s *scheduler) jobCounts() map[protocol.State]int {
	n := make(map[protocol.State]int, 6)
	s.mu.Lock()
	defer s.unlock()
	for i := range s.index.entries {
		switch e := &s.index.entries[i]; {
		case e.j != nil:
			n[e.j.rec.State]++
		case e.live():
			n[e.state()]++
		}
	}
	return n
}

// grace gives every worker a heartbeat timeout of grace from now (offline.go).
func (s *scheduler) grace() {
	s.mu.Lock()
	defer s.unlock()
	s.graceWorkers(s.now())
}
