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

	// One layout for time, queues, workflows and visibility (docs/design.md): each
	// field is empty for a job that does not use it, and the fast encoder writes them
	// in this order.
	Queue           string   `json:"queue,omitempty"`             // its named queue; "" is the default one
	RunAt           int64    `json:"runAtMillis,omitempty"`       // not before: SCHEDULED until then; aging counts from it
	Snoozes         int      `json:"snoozes,omitempty"`           // how often its handler snoozed it
	Schedule        string   `json:"schedule,omitempty"`          // the schedule whose tick made it
	ConcurrencyKey  string   `json:"concurrencyKey,omitempty"`    // bounds how many jobs of one key run at once
	UniqueKey       string   `json:"uniqueKey,omitempty"`         // a unique job's key (type and payload)
	UniqueUntil     int64    `json:"uniqueUntilMillis,omitempty"` // the end of its uniqueness window
	After           []string `json:"after,omitempty"`             // parent jobs it waits for while WAITING
	AfterAnyEnd     bool     `json:"afterAnyEnd,omitempty"`       // it runs however its parents end
	WorkflowID      string   `json:"workflowId,omitempty"`
	Step            string   `json:"step,omitempty"` // its step's name in its workflow
	BatchID         string   `json:"batchId,omitempty"`
	TraceParent     string   `json:"traceparent,omitempty"` // W3C trace context
	TraceState      string   `json:"tracestate,omitempty"`
	Progress        *float64 `json:"progress,omitempty"` // the latest its handler reported, 0 to 1
	ProgressMessage string   `json:"progressMessage,omitempty"`
}

// AgingFrom is when the job's wait for a worker began, in Unix milliseconds: its
// submission, or its run time when it was delayed. Priority aging counts from it.
func (r *Record) AgingFrom() int64 { return max(r.CreatedAt, r.RunAt) }

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
	s.Queue, s.RunAtMillis, s.Schedule, s.After = r.Queue, r.RunAt, r.Schedule, r.After
	s.WorkflowID, s.Step, s.BatchID = r.WorkflowID, r.Step, r.BatchID
	s.Snoozes = r.Snoozes
	s.Progress, s.ProgressMessage = r.Progress, r.ProgressMessage
	return s
}
