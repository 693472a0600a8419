package protocol

import "encoding/json"

// Record is a job as the coordinator stores it in the JobsBucket, under the job's id:
// everything needed to rebuild the coordinator's memory after a restart, the current
// lease included. It is a published schema: readers such as `jobbus watch` and the
// Go client's Watch decode it, so fields are only ever added.
//
// Each stored record also carries headers HeaderSeq and HeaderState, so that its
// submission order and state can be read without its body (a headers-only read of the
// bucket). A finished record expires after the coordinator's retention (a JetStream
// per-message TTL); the key then reads as absent.
type Record struct {
	JobID       string          `json:"jobId"`
	TaskType    string          `json:"taskType"`
	Payload     json.RawMessage `json:"payload"`
	State       State           `json:"state"`
	Attempts    int             `json:"attempts"`
	MaxAttempts int             `json:"maxAttempts"`
	Priority    Priority        `json:"priority"`
	Seq         uint64          `json:"seq"`                 // submission order, from 1
	WorkerID    string          `json:"workerId,omitempty"`  // the current lease's worker, while RUNNING
	AttemptID   string          `json:"attemptId,omitempty"` // the current lease, while RUNNING
	// LastWorkerID is the worker of the latest attempt that ended (with a result, a
	// cancel, its deadline, the worker's loss or a coordinator restart), kept when the
	// lease's WorkerID is cleared: a finished job says which worker ran it.
	LastWorkerID   string  `json:"lastWorkerId,omitempty"`
	Result         *string `json:"result,omitempty"`
	Error          *string `json:"error,omitempty"`
	CreatedAt      int64   `json:"createdAtMillis"`
	UpdatedAt      int64   `json:"updatedAtMillis"`
	EndedAt        int64   `json:"endedAtMillis,omitempty"` // once finished: retention counts from it
	RetryAt        int64   `json:"retryAtMillis,omitempty"` // while RETRY_WAIT
	IdempotencyKey string  `json:"idempotencyKey,omitempty"`
	Fingerprint    string  `json:"fingerprint,omitempty"`
}

// Headers of a stored record.
const (
	HeaderSeq   = "Jobbus-Seq"
	HeaderState = "Jobbus-State"
	// HeaderExpires is when a finished job's retention ends (Unix milliseconds); its
	// record's TTL outlasts it a little.
	HeaderExpires = "Jobbus-Expires"
)

// Snapshot is the record as the client port shows it: workerId only while RUNNING, as
// PROTOCOL.md says, and lastWorkerId (an extension) once an attempt ended.
func (r *Record) Snapshot() Job {
	s := Job{
		JobID:           r.JobID,
		TaskType:        r.TaskType,
		State:           r.State,
		Attempts:        r.Attempts,
		MaxAttempts:     r.MaxAttempts,
		Result:          r.Result,
		Error:           r.Error,
		CreatedAtMillis: r.CreatedAt,
		UpdatedAtMillis: r.UpdatedAt,
		Priority:        r.Priority,
	}
	if s.Priority == "" { // records written before priorities
		s.Priority = PriorityNormal
	}
	if r.State == StateRunning && r.WorkerID != "" {
		w := r.WorkerID
		s.WorkerID = &w
	}
	if r.LastWorkerID != "" && s.WorkerID == nil {
		w := r.LastWorkerID
		s.LastWorkerID = &w
	}
	return s
}
