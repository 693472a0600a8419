package coordinator

import (
	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// Who may speak for a worker. The bus names the sender of every ask in its subject
// (bus.Request.From), so NATS publish permissions vouch for it: a worker user allowed
// to publish only to jobbus.role.coordinator.worker.<its id>.> can speak only as
// itself. The coordinator does its part by taking a worker's registration, heartbeat,
// drain, goodbye and results only from that worker, and a result only for an attempt
// it granted to that worker. The bridge speaks for its TCP workers as each of them
// (one bus node per worker), so its NATS user must be allowed to publish as any
// worker: it is trusted, as the coordinator's own user is.

// speaksFor refuses, with bus.CodeForbidden, a worker request from a sender other than
// the worker it names.
func speaksFor(from bus.Address, workerID string) error {
	if from.Role == bus.RoleWorker && from.ID == workerID {
		return nil
	}
	return bus.Errorf(bus.CodeForbidden,
		"forbidden: %s may not speak for %s: a worker registers, heartbeats, drains, disconnects and reports results only as itself, on subjects that name it",
		from, bus.Address{Role: bus.RoleWorker, ID: workerID})
}

// assignedTo refuses, with bus.CodeForbidden, a result for j's current attempt from a
// worker the attempt was not granted to. Attempt ids are random and new for every
// grant, so an attempt's worker never changes: the check needs no more than the
// record. A result for another attempt is stale, which the caller decides. Called with
// the scheduler's mu held.
func assignedTo(j *job, res *protocol.TaskResult) error {
	if j == nil || j.rec.State != protocol.StateRunning || j.rec.AttemptID != res.AttemptID || j.rec.WorkerID == res.WorkerID {
		return nil
	}
	return bus.Errorf(bus.CodeForbidden,
		"forbidden: attempt %s of job %s was assigned to worker %s, not to worker %s: a worker reports results only for its own attempts",
		res.AttemptID, res.JobID, j.rec.WorkerID, res.WorkerID)
}
