package coordinator

import (
	"container/heap"
	"github.com/jobbus/jobbus/bus/protocol"
	"time"
)

// Attempts running when the coordinator restarted (or another took over). Their
// workers may well be alive and still running them: a restart of the coordinator, or a
// NATS blink, is no reason to abandon them. So recovery keeps each RUNNING job RUNNING
// under its attempt, unclaimed, and waits for its worker: a worker that registers (or
// heartbeats) reporting the attempt (protocol/held.go) claims it, and it goes on as if
// nothing happened; a result for it counts, whether it comes before the worker
// registers or after. No new attempt is started meanwhile, so a job never runs twice
// at once because the coordinator restarted. Only an attempt nobody claims within the
// claim grace (Config.ClaimGrace) is lost, as a worker's attempts are when the worker
// is: its job runs again, or fails on its final attempt. A registration of the
// attempt's worker that reports what it holds, without it, loses it at once (the
// worker restarted, or never received it). claims owns the attempts awaiting their
// workers; guarded by the scheduler's mu, like the jobs they are of.
type claims struct {
	s        *scheduler
	attempts map[string]string // job id -> attempt id
	until    time.Time         // when the unclaimed ones are lost
}

// errUnclaimedFinal is the error of a job whose final attempt was running when the
// coordinator restarted, and that nobody claimed.
const errUnclaimedFinal = "coordinator restarted during final attempt; outcome unknown"

// grace is how long after recovery the workers have to claim their attempts: a
// heartbeat timeout, plus the time their connections take to come back
// (reconnectAllowance), unless configured.
func (cl *claims) grace() time.Duration {
	if cl.s.cfg.ClaimGrace > 0 {
		return cl.s.cfg.ClaimGrace
	}
	return cl.s.cfg.HeartbeatTimeout + reconnectAllowance
}

// await keeps a job restored RUNNING under its attempt until a worker claims it.
// Its execution deadline still runs from the attempt's start, which was the record's
// last write. Called with the scheduler's mu held.
func (cl *claims) await(j *job) {
	if j.rec.AttemptID == "" || j.rec.WorkerID == "" { // nothing to claim it by
		cl.lost(j)
		return
	}
	if cl.attempts == nil {
		cl.attempts = make(map[string]string)
	}
	cl.attempts[j.rec.JobID] = j.rec.AttemptID
	cl.s.route.leaseStarted(j, time.UnixMilli(j.rec.UpdatedAt))
	heap.Push(&cl.s.deadlines, j)
}

// start starts the claim grace, once recovery is done and just before serving.
func (cl *claims) start() {
	cl.s.mu.Lock()
	defer cl.s.unlock()
	if n := len(cl.attempts); n > 0 {
		cl.until = cl.s.now().Add(cl.grace())
		cl.s.log.Info("attempts running before the restart wait for their workers to claim them", "attempts", n, "grace", cl.grace())
	}
}

// extend gives the unclaimed attempts until at least until: the workers'
// silence was the coordinator's (offline.go). Called with the scheduler's mu held.
func (cl *claims) extend(until time.Time) {
	if len(cl.attempts) > 0 && until.After(cl.until) {
		cl.until = until
	}
}

// claim lets w claim the attempt a it reports holding, if it is an unclaimed attempt
// that was w's: its lease becomes w's, numbered 0 as a lease kept across a
// registration (reconcile.go). It reports whether it did. Called with the scheduler's mu held.
func (cl *claims) claim(w *worker, a protocol.AttemptRef) bool {
	if a.AttemptID == "" || cl.attempts[a.JobID] != a.AttemptID {
		return false
	}
	j := cl.s.jobs[a.JobID]
	if j == nil || j.rec.State != protocol.StateRunning || j.rec.AttemptID != a.AttemptID {
		delete(cl.attempts, a.JobID) // it ended meanwhile: a result, a cancel, its deadline
		return false
	}
	if j.rec.WorkerID != w.id {
		return false // another worker's: only its own worker claims it
	}
	delete(cl.attempts, a.JobID)
	w.running[a.JobID] = assignment{attempt: a.AttemptID}
	cl.s.log.Debug("running attempt claimed by its worker", "job", a.JobID, "attempt", a.AttemptID, "worker", w.id)
	return true
}

// reported lets w claim the unclaimed attempts its registration reports (h; nil
// from a worker that reports nothing), and loses at once the others that were w's:
// a worker's report lists every attempt it was assigned whose result is not yet
// acknowledged, so one missing from it is not running there. It returns how many
// were claimed. Called with the scheduler's mu held.
func (cl *claims) reported(w *worker, h *protocol.Held) (claimed int) {
	if h == nil || len(cl.attempts) == 0 {
		return 0
	}
	for _, a := range h.Attempts {
		if cl.claim(w, a.AttemptRef) {
			claimed++
		}
	}
	for jobID := range cl.attempts {
		if j := cl.s.jobs[jobID]; j != nil && j.rec.WorkerID == w.id {
			attempt := cl.attempts[jobID]
			delete(cl.attempts, jobID)
			cl.lose(j, attempt)
		}
	}
	return claimed
}

// expire loses the attempts nobody claimed within the grace. Called with the
// scheduler's mu held.
func (cl *claims) expire(now time.Time) {
	if len(cl.attempts) == 0 || now.Before(cl.until) {
		return
	}
	for jobID, attempt := range cl.attempts {
		if j := cl.s.jobs[jobID]; j != nil {
			cl.lose(j, attempt)
		}
	}
	cl.s.log.Info("attempts running before the restart not claimed by any worker; counted as lost", "attempts", len(cl.attempts))
	cl.attempts = nil
	cl.s.schedule()
}

// lose loses j's attempt, if it is still the unclaimed one. Called with the
// scheduler's mu held.
func (cl *claims) lose(j *job, attempt string) {
	if j.rec.State != protocol.StateRunning || j.rec.AttemptID != attempt {
		return // it ended meanwhile: a result, a cancel, its deadline
	}
	cl.s.releaseLease(j)
	cl.lost(j)
}

// lost settles a RUNNING job whose attempt is lost with the coordinator that
// ran it: the attempt counts, and the job runs again or, if that was its last attempt,
// fails. Called with the scheduler's mu held.
func (cl *claims) lost(j *job) {
	j.rec.WorkerID, j.rec.AttemptID = "", ""
	if j.rec.Attempts >= j.rec.MaxAttempts {
		j.rec.State = protocol.StateFailed
		j.rec.Error = ptr(errUnclaimedFinal)
		cl.s.active--
	} else {
		j.rec.State = protocol.StateQueued
		cl.s.ready.push(j)
	}
	cl.s.markDirty(j, nil)
}
