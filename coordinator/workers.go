package coordinator

import (
	"fmt"
	"sort"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// worker is a registered worker as the coordinator sees it: it tracks capacity itself,
// from the leases it handed out. Guarded by Coordinator.mu.
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
func (c *Coordinator) register(req *protocol.WorkerRegister) (*protocol.WorkerRegistered, error) {
	if perr := req.Validate(); perr != nil {
		return nil, bus.WithCode(bus.CodeBadRequest, perr)
	}
	if err := c.declare(req); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.unlock()
	if c.fenced != nil {
		return nil, bus.WithCode(bus.CodeUnavailable, c.refuse())
	}
	kept := make(map[string]assignment)
	if old := c.workers[req.WorkerID]; old != nil {
		kept = c.handOver(old, req)
		c.loseWorker(old, "worker re-registered")
	}
	w := &worker{id: req.WorkerID, capacity: req.Capacity, running: kept, lastSeen: c.now(),
		taskTypes: c.workerTypes(req), session: newID(), instance: req.Instance}
	claimed := c.claimReported(w, req.Held) // attempts it ran before a restart (recover.go): kept too
	c.workers[w.id] = w
	c.log.Info("worker registered", "worker", w.id, "capacity", w.capacity, "kept", len(kept)-claimed, "claimed", claimed)
	c.schedule()
	return &protocol.WorkerRegistered{WorkerID: w.id, Mark: w.mark(), Kept: keptRefs(kept, req.Held)}, nil
}

// heartbeat refreshes a worker, reconciles what it reports it holds (reconcile.go),
// and answers where its assignments stand; an unknown worker is told so, and registers
// again.
func (c *Coordinator) heartbeat(hb *protocol.Heartbeat) (protocol.HeartbeatAck, error) {
	c.mu.Lock()
	defer c.unlock()
	w := c.workers[hb.WorkerID]
	if w == nil {
		return protocol.HeartbeatAck{}, bus.Errorf(bus.CodeNotFound, "unknown worker %s: register again", hb.WorkerID)
	}
	w.lastSeen = c.now()
	if hb.Held != nil && c.fenced == nil {
		c.reconcile(w, hb.Held)
	}
	return protocol.HeartbeatAck{Mark: w.mark()}, nil
}

// drain stops assigning to a worker that is shutting down; its running attempts go on.
// The answer counts them, assignments not yet delivered included, so the worker knows
// when it is done.
func (c *Coordinator) drain(d *protocol.Drain) (protocol.DrainAck, error) {
	c.mu.Lock()
	defer c.unlock()
	if c.fenced != nil {
		return protocol.DrainAck{}, c.refuse()
	}
	w := c.workers[d.WorkerID]
	if w == nil {
		return protocol.DrainAck{}, bus.Errorf(bus.CodeNotFound, "unknown worker %s: register again", d.WorkerID)
	}
	if !w.draining {
		w.draining = true
		c.log.Info("worker draining", "worker", w.id, "running", len(w.running))
	}
	return protocol.DrainAck{Running: len(w.running)}, nil
}

// disconnect loses a worker whose connection is gone.
func (c *Coordinator) disconnect(d *protocol.Disconnect) {
	c.mu.Lock()
	defer c.unlock()
	if w := c.workers[d.WorkerID]; w != nil {
		c.loseWorker(w, d.Cause)
		c.schedule()
	}
}

// loseWorker removes w; each of its running attempts goes to retry-or-fail. Called with
// c.mu held.
func (c *Coordinator) loseWorker(w *worker, cause string) {
	if c.workers[w.id] != w {
		return
	}
	delete(c.workers, w.id)
	c.log.Info("worker lost", "worker", w.id, "cause", cause, "running", len(w.running))
	for jobID, a := range w.running {
		j := c.jobs[jobID]
		if j == nil || j.rec.State != protocol.StateRunning || j.rec.AttemptID != a.attempt {
			continue
		}
		j.rec.LastWorkerID, j.rec.WorkerID, j.rec.AttemptID = w.id, "", ""
		c.deadlines.remove(j)
		c.leaseEnded(j)
		c.retryOrFail(j, fmt.Sprintf("worker %s lost (%s)", w.id, cause))
		c.markDirty(j, nil)
	}
	w.running = nil
	c.unserved(w)
}

// hasFreeWorker reports whether some worker has a free slot for taskType.
func (c *Coordinator) hasFreeWorker(taskType string) bool {
	for _, w := range c.workers {
		if w.free() > 0 && w.runs(taskType) {
			return true
		}
	}
	return false
}

// pickWorker chooses the worker with the most free slots for taskType, ties by id.
func (c *Coordinator) pickWorker(taskType string) *worker {
	var best *worker
	for _, w := range c.workers {
		if w.free() <= 0 || !w.runs(taskType) {
			continue
		}
		if best == nil || w.free() > best.free() || (w.free() == best.free() && w.id < best.id) {
			best = w
		}
	}
	return best
}

// workerList is the live workers sorted by id.
func (c *Coordinator) workerList() []protocol.Worker {
	c.mu.Lock()
	defer c.unlock()
	out := make([]protocol.Worker, 0, len(c.workers))
	for _, w := range c.workers {
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
