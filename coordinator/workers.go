package coordinator

import (
	"fmt"
	"github.com/nats-io/nats.go"
	"sort"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// registry is the workers the scheduler assigns to: each registration, its capacity
// and the leases it holds (reconcile.go), and what the sweeper knows of the
// coordinator's own connection (offline.go). It is guarded by the scheduler's mu, since
// an assignment changes a job and a worker at once; it changes jobs only through the
// scheduler (s), whose lock it holds when it does.
type registry struct {
	s       *scheduler
	nc      *nats.Conn // the coordinator's connection, whose outages the sweeper sees; nil in tests
	workers map[string]*worker
	off     offline
}

// worker is a registered worker as the coordinator sees it: it tracks capacity itself,
// from the leases it handed out. Guarded by scheduler.mu.
type worker struct {
	id        string
	capacity  int
	taskTypes map[string]bool       // what it serves (routing.go)
	running   map[string]assignment // by job id (reconcile.go)
	lastSeen  time.Time
	// graceUntil: until then its silence is not counted, after an outage of the
	// coordinator's own (offline.go).
	graceUntil time.Time
	// session names this registration, seq counts the assignments sent to it: a
	// worker's report is judged against them (reconcile.go).
	session  string
	seq      uint64
	instance string // the worker process's own name, if it says one (WorkerRegister.Instance)
	draining bool   // it finishes what it runs and takes nothing more
	// queues it serves, by weight or in strict order (dispatch.go); idleRound is the
	// last dispatch pass in which it found nothing to take.
	queues    []servedQueue
	strict    bool
	idleRound uint64
	// batch is the most assignments it takes in one TaskAssigns (WorkerRegister.Assigns,
	// at most protocol.MaxAssigns); 0: each goes alone on PathAssign (outbox.go).
	batch int
}

func (w *worker) free() int {
	if w.draining {
		return 0
	}
	return w.capacity - len(w.running)
}

func (w *worker) runs(taskType string) bool {
	return w.taskTypes[taskType]
}

// register adds a worker, superseding a live one with the same id. The attempts of the
// live one that the registration reports it holds are kept (reconcile.go).
func (reg *registry) register(req *protocol.WorkerRegister) (*protocol.WorkerRegistered, error) {
	if perr := req.Validate(); perr != nil {
		return nil, bus.WithCode(bus.CodeBadRequest, perr)
	}
	if err := protocol.CheckQueueWeights(req.Queues); err != nil {
		return nil, errRegistration("%v", err)
	}
	if err := reg.declare(req); err != nil {
		return nil, err
	}
	reg.s.mu.Lock()
	defer reg.s.unlock()
	if reg.s.fenced != nil {
		return nil, bus.WithCode(bus.CodeUnavailable, reg.s.refuse())
	}
	kept := make(map[string]assignment)
	if old := reg.workers[req.WorkerID]; old != nil {
		kept = reg.handOver(old, req)
		reg.loseWorker(old, "worker re-registered")
	}
	w := &worker{id: req.WorkerID, capacity: req.Capacity, running: kept, lastSeen: reg.s.now(),
		taskTypes: reg.workerTypes(req), session: newID(), instance: req.Instance,
		queues: servedQueues(req), strict: req.StrictQueues, batch: min(max(req.Assigns, 0), protocol.MaxAssigns)}
	claimed := reg.s.claims.reported(w, req.Held) // attempts it ran before a restart (claims.go): kept too
	reg.workers[w.id] = w
	reg.s.ready.served(w)
	reg.s.log.Info("worker registered", "worker", w.id, "capacity", w.capacity, "kept", len(kept)-claimed, "claimed", claimed)
	reg.s.schedule()
	return &protocol.WorkerRegistered{WorkerID: w.id, Mark: w.mark(), Kept: keptRefs(kept, req.Held),
		Results: protocol.MaxResults}, nil // api.go serves PathResults
}

// heartbeat refreshes a worker, reconciles what it reports it holds (reconcile.go),
// and answers where its assignments stand; an unknown worker is told so, and registers
// again.
func (reg *registry) heartbeat(hb *protocol.Heartbeat) (protocol.HeartbeatAck, error) {
	reg.s.mu.Lock()
	defer reg.s.unlock()
	w := reg.workers[hb.WorkerID]
	if w == nil {
		return protocol.HeartbeatAck{}, bus.Errorf(bus.CodeNotFound, "unknown worker %s: register again", hb.WorkerID)
	}
	w.lastSeen = reg.s.now()
	if hb.Held != nil && reg.s.fenced == nil {
		reg.reconcile(w, hb.Held)
	}
	return protocol.HeartbeatAck{Mark: w.mark()}, nil
}

// drain stops assigning to a worker that is shutting down; its running attempts go on.
// The answer counts them, assignments not yet delivered included, so the worker knows
// when it is done.
func (reg *registry) drain(d *protocol.Drain) (protocol.DrainAck, error) {
	reg.s.mu.Lock()
	defer reg.s.unlock()
	if reg.s.fenced != nil {
		return protocol.DrainAck{}, reg.s.refuse()
	}
	w := reg.workers[d.WorkerID]
	if w == nil {
		return protocol.DrainAck{}, bus.Errorf(bus.CodeNotFound, "unknown worker %s: register again", d.WorkerID)
	}
	if !w.draining {
		w.draining = true
		reg.s.log.Info("worker draining", "worker", w.id, "running", len(w.running))
	}
	return protocol.DrainAck{Running: len(w.running)}, nil
}

// disconnect loses a worker whose connection is gone.
func (reg *registry) disconnect(d *protocol.Disconnect) {
	reg.s.mu.Lock()
	defer reg.s.unlock()
	if w := reg.workers[d.WorkerID]; w != nil {
		reg.loseWorker(w, d.Cause)
		reg.s.schedule()
	}
}

// loseWorker removes w; each of its running attempts goes to retry-or-fail. Called with
// the scheduler's mu held.
func (reg *registry) loseWorker(w *worker, cause string) {
	if reg.workers[w.id] != w {
		return
	}
	delete(reg.workers, w.id)
	reg.s.log.Info("worker lost", "worker", w.id, "cause", cause, "running", len(w.running))
	for jobID, a := range w.running {
		j := reg.s.jobs[jobID]
		if j == nil || j.rec.State != protocol.StateRunning || j.rec.AttemptID != a.attempt {
			continue
		}
		j.rec.LastWorkerID, j.rec.WorkerID, j.rec.AttemptID = w.id, "", ""
		reg.s.deadlines.remove(j)
		reg.s.route.leaseEnded(j)
		reg.s.retryOrFail(j, fmt.Sprintf("worker %s lost (%s)", w.id, cause))
		reg.s.markDirty(j, nil)
	}
	w.running = nil
	reg.unserved(w)
}

// workerList is the live workers sorted by id.
func (reg *registry) workerList() []protocol.Worker {
	reg.s.mu.Lock()
	defer reg.s.unlock()
	out := make([]protocol.Worker, 0, len(reg.workers))
	for _, w := range reg.workers {
		out = append(out, protocol.Worker{
			WorkerID:            w.id,
			Capacity:            w.capacity,
			ActiveTasks:         len(w.running),
			LastHeartbeatMillis: w.lastSeen.UnixMilli(),
		})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].WorkerID < out[b].WorkerID })
	return out
}
