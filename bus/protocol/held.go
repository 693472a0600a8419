package protocol

// Reconciliation of a native worker's attempts with the coordinator's leases (a native
// extension; spec peers never send or see any of it). A tell can be lost while a
// connection is down: a TASK_ASSIGN the worker never received would otherwise hold its
// job RUNNING until the execution deadline, and a TASK_CANCEL never received would let
// a revoked attempt run on. So a worker reports, with every heartbeat and
// registration, the attempts it holds and how far it has heard the coordinator's
// assignments (a Mark); the coordinator re-queues what it assigned up to that mark
// and the worker does not hold, and cancels what the worker holds under no live lease.
//
// Why a mark and not a time: the coordinator numbers its assignments to each
// registration, and answers a heartbeat or a registration with the number of the last
// one it has sent, after it has sent it, on the same NATS connection. NATS delivers one
// connection's messages in order, so a worker that received the answer carrying
// number n has received every assignment up to n that reached it at all: one it does
// not hold was lost, however the timings fall. An assignment after n may still be on
// its way, and is never judged by that mark. (The worker reports a mark only once the
// next answer has arrived, so that the assignments before it have been handled, not
// only received: workerproto.Holdings.)
//
// Registering again under a live worker id ends the old registration. The attempts the
// new one reports it holds keep their leases; when it comes from the same worker
// process (WorkerRegister.Instance), so do the others, which its reports under the new
// registration then settle.

// AttemptRef names an attempt: its job, and its attempt id (the lease).
type AttemptRef struct {
	JobID     string `json:"jobId"`
	AttemptID string `json:"attemptId"`
}

// HeldAttempt is an attempt a worker holds. Done says it has finished and its result is
// on its way: it needs no TASK_CANCEL, even once the coordinator has settled it.
type HeldAttempt struct {
	AttemptRef
	Done bool `json:"done,omitempty"`
}

// Mark is how far the coordinator's assignments to one registration of a worker go:
// the registration (Session, chosen by the coordinator) and the number of assignments
// sent to it (Seq).
type Mark struct {
	Session string `json:"session"`
	Seq     uint64 `json:"seq"`
}

// Held is a worker's report of what it holds: every attempt assigned to it whose
// result the coordinator has not yet acknowledged (running, or its result on its way),
// and a Mark it received in the answer to an earlier heartbeat or registration (the
// zero Mark if none).
type Held struct {
	Mark
	Attempts []HeldAttempt `json:"attempts"`
}

// HeartbeatAck answers a native heartbeat. Mark is where the coordinator's assignments
// to the worker stand now (nil from a coordinator that does not reconcile).
type HeartbeatAck struct {
	Mark *Mark `json:"mark,omitempty"`
}
