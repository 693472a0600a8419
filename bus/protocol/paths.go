package protocol

// Bus paths of the worker protocol over NATS. Workers address the coordinator role
// (load-balanced to the leader); the coordinator addresses a worker by its id, reaching it
// over the connection the worker opened.
const (
	// PathRegister: worker asks WorkerRegister, coordinator answers WorkerRegistered.
	PathRegister = "worker.register"
	// PathHeartbeat: worker asks Heartbeat, coordinator answers Heartbeat; an error
	// answer means the coordinator does not know the worker, which then registers again.
	PathHeartbeat = "worker.heartbeat"
	// PathDisconnect: worker (or the bridge for it) asks Disconnect when it goes away,
	// answered once the coordinator has let it go.
	PathDisconnect = "worker.disconnect"
	// PathDrain: worker asks Drain when it stops taking work; the coordinator assigns it
	// nothing more and answers DrainAck with the attempts it still counts as running
	// there (an error answer: it does not know the worker). Running attempts go on until
	// their results arrive; the worker asks again until none are left.
	PathDrain = "worker.drain"
	// PathResult: worker asks TaskResult; the answer (ResultAck) comes once the outcome is
	// durable, and the worker repeats the ask until it gets one.
	PathResult = "task.result"
	// PathAssign: coordinator tells TaskAssign to a worker.
	PathAssign = "task.assign"
	// PathCancel: coordinator tells TaskCancel to a worker.
	PathCancel = "task.cancel"
)

// Disconnect reports that a worker's connection is gone, so the coordinator need not
// wait for the heartbeat timeout.
type Disconnect struct {
	WorkerID string `json:"workerId"`
	Cause    string `json:"cause"`
}

// Drain asks the coordinator to assign a worker nothing more: it is shutting down and
// finishes what it runs.
type Drain struct {
	WorkerID string `json:"workerId"`
}

// DrainAck answers Drain: Running is the number of attempts the coordinator counts as
// running on the worker, including assignments still on their way to it.
type DrainAck struct {
	Running int `json:"running"`
}

// ResultAck answers a TaskResult once it is durable. Accepted is false for a stale
// result, which changed nothing.
type ResultAck struct {
	JobID    string `json:"jobId"`
	Accepted bool   `json:"accepted"`
}
