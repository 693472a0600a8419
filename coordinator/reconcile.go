package coordinator

import (
	"context"
	"sort"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// Reconciliation (protocol/held.go): a worker reports, with its heartbeats and
// registrations, the attempts it holds and the last Mark it received; the coordinator
// compares them with the leases it gave the worker. Tells lost while a connection was
// down are found this way within a few heartbeats, instead of at an attempt's execution
// deadline, and a worker whose connection came back keeps its attempts: it heartbeats
// rather than registering again.

// assignment is a lease given to a worker: its attempt id, and its number among the
// assignments to the worker's registration (0: one kept from an earlier registration,
// which the worker reported it holds).
type assignment struct {
	attempt string
	seq     uint64 // unsent until its TASK_ASSIGN is queued
}

// unsent numbers an assignment that waits for its job's first write: above any mark.
const unsent = ^uint64(0)

// mark is where w's assignments stand: every one numbered up to it has been decided,
// and is sent before an answer carrying the mark (see flushed).
func (w *worker) mark() *protocol.Mark { return &protocol.Mark{Session: w.session, Seq: w.seq} }

// reconcile compares what w reports it holds with the leases it has here. Called with
// the scheduler's mu held.
//
//   - A lease numbered up to the report's mark that the worker does not hold was never
//     delivered: the worker heard a later answer of this coordinator, and NATS delivers
//     in order, so the assignment was lost. The job goes back to the queue at once
//     (undelivered). An assignment after the mark may still be on its way and is left
//     alone; so is everything when the mark is of another registration.
//   - An attempt the worker runs under no lease here (cancelled, or lost and assigned
//     again, while a TASK_CANCEL could not reach it) gets a TASK_CANCEL again. Its
//     result, if it comes, is stale as before. One the worker reports done (its result
//     on its way) needs none.
func (reg *registry) reconcile(w *worker, h *protocol.Held) {
	holds := make(map[string]bool, len(h.Attempts))
	for _, a := range h.Attempts {
		holds[a.AttemptID] = true
	}
	requeued := 0
	if h.Session == w.session {
		for jobID, a := range w.running {
			if a.seq <= h.Seq && !holds[a.attempt] {
				reg.undelivered(w, jobID, a)
				requeued++
			}
		}
	}
	for _, a := range h.Attempts {
		if w.running[a.JobID].attempt == a.AttemptID || reg.s.claims.claim(w, a.AttemptRef) || a.Done {
			continue
		}
		reg.s.log.Debug("worker holds an attempt under no lease; cancelling it", "worker", w.id, "job", a.JobID, "attempt", a.AttemptID)
		m := &protocol.TaskCancel{JobID: a.JobID, AttemptID: a.AttemptID}
		to := bus.Address{Role: bus.RoleWorker, ID: w.id}
		reg.s.out.later(func() error {
			_ = reg.s.link.Tell(context.Background(), to, protocol.PathCancel, m)
			return nil
		}, nil)
	}
	if requeued > 0 {
		reg.s.log.Info("assignments never delivered; jobs queued again", "worker", w.id, "jobs", requeued)
		reg.s.schedule()
	}
}

// undelivered ends the lease of an assignment that never reached w and queues its job
// again, without counting the attempt. Called with the scheduler's mu held.
//
// Why the attempt does not count: an attempt is spent when it ran, or may have run
// (a worker lost with it, a restart while it ran: its outcome is unknown, and
// PROTOCOL.md's retry budget bounds how often a task runs). This one certainly did
// not run: the worker never received it. Counting it would let a transport fault fail
// a job on its final attempt without its task ever running, and would shift the
// attemptNumber the task sees (FAIL counts executions by it). So the job is QUEUED
// again at once, keeping its place (submission sequence), its attempts as before the
// assignment, and its last error.
func (reg *registry) undelivered(w *worker, jobID string, a assignment) {
	delete(w.running, jobID)
	j := reg.s.jobs[jobID]
	if j == nil || j.rec.State != protocol.StateRunning || j.rec.AttemptID != a.attempt {
		return
	}
	reg.s.log.Debug("assignment never delivered; job queued again", "job", jobID, "attempt", a.attempt, "worker", w.id)
	reg.s.deadlines.remove(j)
	reg.s.route.leaseEnded(j)
	reg.s.flow.unstarted(queueOf(j), j.rec.TaskType) // nothing started: nor does it count against a rate limit
	j.rec.WorkerID, j.rec.AttemptID = "", ""
	j.rec.Attempts--
	j.rec.State = protocol.StateQueued
	j.rec.RetryAt = 0
	reg.s.markDirty(j, nil)
	reg.s.ready.push(j)
}

// handOver settles the leases of old, a registration being superseded by req, before
// old is lost, and returns the leases the new registration keeps (numbered 0: sent
// before its first assignment, so judged by its first mark).
//
//   - Those req reports it holds. Keeping them is sound because only a worker that
//     received an assignment knows its attempt id, and a result counts only under it: a
//     different process registering under the same id knows none, reports none.
//   - From the same worker process (req.Instance, a random name it gives each of its
//     registrations), all of them: it registered again although the coordinator knew
//     it (the answer to its registration was lost, say), and reports everything it
//     holds, so one it does not hold is lost or still on its way. Its reports under the
//     new registration tell which, race-free: the answer that starts it leaves after
//     every assignment of old.
//   - From another process, or one that reports nothing, none: old's attempts are lost
//     with the worker, as before.
//
// Called with the scheduler's mu held.
func (reg *registry) handOver(old *worker, req *protocol.WorkerRegister) map[string]assignment {
	kept := make(map[string]assignment)
	h := req.Held
	if h == nil {
		return kept
	}
	holds := make(map[string]bool, len(h.Attempts))
	for _, a := range h.Attempts {
		holds[a.AttemptID] = true
	}
	same := req.Instance != "" && req.Instance == old.instance
	for jobID, a := range old.running {
		if holds[a.attempt] || same {
			kept[jobID] = assignment{attempt: a.attempt}
			delete(old.running, jobID)
		}
	}
	return kept
}

// keptRefs lists the kept leases the registration reported it holds, sorted by job id.
func keptRefs(kept map[string]assignment, h *protocol.Held) []protocol.AttemptRef {
	if h == nil {
		return nil
	}
	holds := make(map[string]bool, len(h.Attempts))
	for _, a := range h.Attempts {
		holds[a.AttemptID] = true
	}
	if len(kept) == 0 {
		return nil
	}
	out := make([]protocol.AttemptRef, 0, len(kept))
	for jobID, a := range kept {
		if holds[a.attempt] {
			out = append(out, protocol.AttemptRef{JobID: jobID, AttemptID: a.attempt})
		}
	}
	sort.Slice(out, func(i, k int) bool { return out[i].JobID < out[k].JobID })
	return out
}
