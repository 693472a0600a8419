package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// routing routes jobs by task type: a job goes only to a worker that serves its type,
// and a type at its concurrency limit waits without holding back the jobs of other
// types (dispatch skips a type at its limit, dispatch.go). It owns the count of
// RUNNING jobs by type (typeRuns) and reads each type's options from the catalogue;
// guarded by the scheduler's mu, like the rest of scheduling.
type routing struct {
	s        *scheduler
	cfg      *Config
	cat      *catalogue
	reg      *registry
	typeRuns map[string]int
}

// leaseStarted counts j's new attempt against its type, and fixes the attempt's
// execution deadline from the type's timeout (else the coordinator's).
func (rt *routing) leaseStarted(j *job, now time.Time) {
	j.timeout = rt.cfg.TaskTimeout
	if ms := rt.cat.options(j.rec.TaskType).TimeoutMillis; ms > 0 {
		j.timeout = time.Duration(ms) * time.Millisecond
	}
	j.deadline = now.Add(j.timeout)
	if !j.leased {
		j.leased = true
		rt.typeRuns[j.rec.TaskType]++
		rt.s.ready.queueStarted(j)
	}
}

// leaseEnded stops counting j's attempt, however it ended.
func (rt *routing) leaseEnded(j *job) {
	if !j.leased {
		return
	}
	j.leased = false
	rt.s.queueEnded(j)
	if n := rt.typeRuns[j.rec.TaskType] - 1; n > 0 {
		rt.typeRuns[j.rec.TaskType] = n
	} else {
		delete(rt.typeRuns, j.rec.TaskType)
	}
}

// defaultMaxAttempts is the max attempts of a submission that asked for none.
func (rt *routing) defaultMaxAttempts(taskType string) int {
	if n := rt.cat.options(taskType).MaxAttempts; n > 0 {
		return n
	}
	return rt.cfg.MaxAttempts
}

// failPermanently ends a job whose attempt failed with a permanent error: FAILED at
// once, whatever attempts it has left. The lease must already be released.
func (s *scheduler) failPermanently(j *job, cause string) {
	j.rec.State = protocol.StateFailed
	j.rec.Error = ptr(fmt.Sprintf("%s (permanent failure on attempt %d of %d; not retried)", cause, j.rec.Attempts, j.rec.MaxAttempts))
	j.rec.RetryAt = 0
	s.active--
}

// workerTypes is what a registration serves: its list, or the built-ins without one
// (a spec peer).
func (reg *registry) workerTypes(req *protocol.WorkerRegister) map[string]bool {
	names := reg.s.cfg.TaskTypes.Names()
	if req.TaskTypes != nil {
		names = protocol.Names(req.TaskTypes)
	}
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out
}

// declare catalogues the task types of a registration before the worker counts as
// registered.
func (reg *registry) declare(req *protocol.WorkerRegister) error {
	if req.TaskTypes == nil {
		return nil
	}
	// A fenced coordinator, or one not certainly holding its lease, declares nothing
	// (the catalogue's writes are not fenced by the term themselves: this narrows the
	// window to a leader deposed mid-declaration).
	reg.s.mu.Lock()
	var refused error
	switch {
	case reg.s.fenced != nil:
		refused = bus.WithCode(bus.CodeUnavailable, reg.s.refuse())
	case !reg.s.lease.held():
		refused = leaseLapsed()
	}
	reg.s.unlock()
	if refused != nil {
		return refused
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return reg.s.cat.declare(ctx, req.WorkerID, req.TaskTypes, reg.s.now())
}

// unserved notes, in the background, when the catalogue's types that w served lost
// their last worker. Called with the scheduler's mu held, after w left the registry.
func (reg *registry) unserved(w *worker) {
	var gone []string
	for t := range w.taskTypes {
		if _, builtin := reg.s.cfg.TaskTypes.Lookup(t); builtin || reg.hasWorker(t) {
			continue
		}
		gone = append(gone, t)
	}
	if len(gone) == 0 || reg.s.cat.kv == nil {
		return
	}
	now := reg.s.now()
	reg.s.run(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		reg.s.cat.served(ctx, gone, now)
	})
}

func (reg *registry) hasWorker(taskType string) bool {
	for _, w := range reg.workers {
		if w.runs(taskType) {
			return true
		}
	}
	return false
}

// validatePayload checks a submission's payload against its task type.
func (rt *routing) validatePayload(taskType string, payload json.RawMessage) error {
	return rt.cat.validate(taskType, payload)
}
