package protocol

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// State is a job's lifecycle state.
type State string

// The job states of PROTOCOL.md.
const (
	StateQueued    State = "QUEUED"
	StateRunning   State = "RUNNING"
	StateRetryWait State = "RETRY_WAIT"
	StateCompleted State = "COMPLETED"
	StateFailed    State = "FAILED"
	StateCancelled State = "CANCELLED"
)

// States beyond PROTOCOL.md's, shown on the client port as documented extensions: a job
// waiting for its time (a delayed job, a snoozed one) or for its parent jobs.
const (
	StateScheduled State = "SCHEDULED"
	StateWaiting   State = "WAITING"
)

// StateUnknown is no job's state: what a workflow's step, or a job's parent, reads once
// its record is no longer kept (its retention ended), and a workflow made of such steps.
const StateUnknown State = "UNKNOWN"

// States lists every state in lifecycle order.
var States = []State{StateScheduled, StateWaiting, StateQueued, StateRunning, StateRetryWait, StateCompleted, StateFailed, StateCancelled}

// Terminal reports whether no further transition can leave s.
func (s State) Terminal() bool {
	return s == StateCompleted || s == StateFailed || s == StateCancelled
}

// Active reports whether s counts against the admission limit.
func (s State) Active() bool {
	return s == StateQueued || s == StateRunning || s == StateRetryWait || s == StateScheduled || s == StateWaiting
}

// ParseState reads a state name, case-insensitively.
func ParseState(s string) (State, error) {
	for _, st := range States {
		if strings.EqualFold(s, string(st)) {
			return st, nil
		}
	}
	return "", fmt.Errorf("unknown state %q (one of SCHEDULED, WAITING, QUEUED, RUNNING, RETRY_WAIT, COMPLETED, FAILED, CANCELLED)", s)
}

// Priority is a job's base scheduling priority.
type Priority string

// The priorities of PROTOCOL.md; an absent priority means NORMAL.
const (
	PriorityHigh   Priority = "HIGH"
	PriorityNormal Priority = "NORMAL"
	PriorityLow    Priority = "LOW"
)

// Level is the priority's numeric level: HIGH=2, NORMAL=1, LOW=0.
func (p Priority) Level() int {
	switch p {
	case PriorityHigh:
		return 2
	case PriorityLow:
		return 0
	default:
		return 1
	}
}

// ParsePriority reads a priority name, case-insensitively.
func ParsePriority(s string) (Priority, error) {
	for _, p := range []Priority{PriorityHigh, PriorityNormal, PriorityLow} {
		if strings.EqualFold(s, string(p)) {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown priority %q (one of HIGH, NORMAL, LOW)", s)
}

// UnmarshalJSON accepts exactly the three upper-case names, and null (as encoding/json's
// own decoding does, it leaves p unchanged).
func (p *Priority) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("field 'priority' must be one of HIGH, NORMAL, LOW")
	}
	switch Priority(s) {
	case PriorityHigh, PriorityNormal, PriorityLow:
		*p = Priority(s)
		return nil
	}
	return fmt.Errorf("field 'priority' must be one of HIGH, NORMAL, LOW, got %q", s)
}

// OrNormal is the effective priority of an optional one.
func OrNormal(p *Priority) Priority {
	if p == nil {
		return PriorityNormal
	}
	return *p
}

// WorkerRegister must be a worker's first message.
type WorkerRegister struct {
	WorkerID string `json:"workerId"`
	Capacity int    `json:"capacity"`
	// TaskTypes is a native extension: the task types this worker runs (absent: the five
	// built-ins), each a name or a declaration (TaskTypeDecl). Spec peers never send it.
	// omitzero, not omitempty: an empty list must not turn into "absent".
	TaskTypes []TaskTypeDecl `json:"taskTypes,omitzero"`
	// Held is a native extension (held.go): what a worker registering again still
	// holds, so that the coordinator keeps those attempts instead of failing them.
	Held *Held `json:"held,omitempty"`
	// Instance is a native extension (held.go): a random name of the worker process,
	// the same for each of its registrations.
	Instance string `json:"instance,omitempty"`
	// Queues and StrictQueues are native extensions (queues.go): the queues this
	// worker serves, with their weights (absent: DefaultQueue only), and whether it
	// takes them in strict order (each queue only while those before it have nothing
	// it can start) instead of by weight.
	Queues       []QueueWeight `json:"queues,omitempty"`
	StrictQueues bool          `json:"strictQueues,omitempty"`
	// Assigns is a native extension (assigns.go): the most assignments this worker
	// takes in one TaskAssigns on PathAssigns (the bridge says it for every TCP worker,
	// whatever its frame said). Absent (an older native worker or bridge): each
	// assignment comes alone, a TaskAssign on PathAssign.
	Assigns int `json:"assigns,omitempty"`
}

// WorkerRegistered acknowledges a registration.
type WorkerRegistered struct {
	WorkerID string `json:"workerId"`
	// Mark and Kept are native extensions (held.go), never sent to a spec peer: where
	// the new registration's assignments start, and which attempts of those the
	// registration reported it kept (the worker abandons the others).
	Mark *Mark        `json:"mark,omitempty"`
	Kept []AttemptRef `json:"kept,omitempty"`
	// Results is a native extension (results.go), never sent to a spec peer: the most
	// results the coordinator takes in one TaskResults on PathResults. 0, from a
	// coordinator that does not serve that path: the worker delivers each result on its
	// own (PathResult).
	Results int `json:"results,omitempty"`
}

// Heartbeat keeps a worker alive.
type Heartbeat struct {
	WorkerID string `json:"workerId"`
	// Held is a native extension (held.go); a spec peer's frame has only workerId.
	Held *Held `json:"held,omitempty"`
}

// TaskAssign hands an attempt to a worker; AttemptID is the lease.
type TaskAssign struct {
	JobID         string          `json:"jobId"`
	AttemptID     string          `json:"attemptId"`
	AttemptNumber int             `json:"attemptNumber"`
	TaskType      string          `json:"taskType"`
	Payload       json.RawMessage `json:"payload"`
	// TraceParent and TraceState (native extensions, trace.go) are the job's W3C trace
	// context, so that the attempt's span joins the submitter's trace. The bridge
	// leaves them out of what it writes to a spec worker.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// TaskCancel revokes an attempt.
type TaskCancel struct {
	JobID     string `json:"jobId"`
	AttemptID string `json:"attemptId"`
}

// TaskResult reports an attempt's outcome; it must echo the lease.
type TaskResult struct {
	WorkerID  string  `json:"workerId"`
	JobID     string  `json:"jobId"`
	AttemptID string  `json:"attemptId"`
	Success   bool    `json:"success"`
	Result    *string `json:"result"`
	Error     *string `json:"error"`
	// Permanent (a native extension) says a failure must not be retried: the job fails
	// at once, whatever attempts it has left. Spec peers never send it.
	Permanent bool `json:"permanent,omitzero"`
	// SnoozeMillis (a native extension, with success false) asks to run the job again
	// after this many milliseconds without using an attempt: it goes back to SCHEDULED.
	SnoozeMillis int64 `json:"snoozeMillis,omitzero"`
}

// Error tells a peer its request was wrong.
type Error struct {
	Message string `json:"message"`
}

// Error makes a protocol Error usable as a Go error.
func (e *Error) Error() string { return e.Message }

// SubmitJob asks for a new job.
type SubmitJob struct {
	TaskType       string          `json:"taskType"`
	Payload        json.RawMessage `json:"payload"`
	MaxAttempts    int             `json:"maxAttempts"`
	IdempotencyKey *string         `json:"idempotencyKey"`
	Priority       *Priority       `json:"priority"`

	// Extensions spec peers never send (docs/PROTOCOL.md "Extensions"), all optional.
	Queue           string   `json:"queue,omitempty"`           // its named queue; "" is the default one
	RunAtMillis     int64    `json:"runAtMillis,omitempty"`     // not before this time (Unix ms): SCHEDULED until then
	RunInMillis     int64    `json:"runInMillis,omitempty"`     // not before this long from now
	ConcurrencyKey  string   `json:"concurrencyKey,omitempty"`  // bounds how many jobs of one key run at once
	UniqueForMillis int64    `json:"uniqueForMillis,omitempty"` // an equal job within this window answers for it
	UniqueWhile     string   `json:"uniqueWhile,omitempty"`     // "active": an equal active job answers for it
	After           []string `json:"after,omitempty"`           // parent jobs: WAITING until they end
	AfterAnyEnd     bool     `json:"afterAnyEnd,omitempty"`     // run however the parents end
}

// extended reports whether s uses any extension field: those take encoding/json.
func (s *SubmitJob) extended() bool {
	return s.Queue != "" || s.RunAtMillis != 0 || s.RunInMillis != 0 || s.ConcurrencyKey != "" ||
		s.UniqueForMillis != 0 || s.UniqueWhile != "" || s.After != nil || s.AfterAnyEnd
}

// JobSubmitted answers an accepted (or deduplicated) submission.
type JobSubmitted struct {
	JobID string `json:"jobId"`
}

// SubmitRejected answers a well-formed submission refused for overload.
type SubmitRejected struct {
	Reason      string `json:"reason"`
	ActiveCount int    `json:"activeCount"`
	Limit       int    `json:"limit"`
	Retryable   bool   `json:"retryable"`
}

// GetJobStatus asks for one job's snapshot.
type GetJobStatus struct {
	JobID string `json:"jobId"`
}

// JobStatus answers GetJobStatus.
type JobStatus struct {
	Job Job `json:"job"`
}

// ListJobs asks for jobs, newest first. Limit, State and Cursor are native extensions
// that spec peers omit.
type ListJobs struct {
	Limit  int    `json:"limit,omitempty"`
	State  *State `json:"state,omitempty"`
	Cursor string `json:"cursor,omitempty"`
}

// JobList answers ListJobs. NextCursor (native) is set when more jobs follow.
type JobList struct {
	Jobs       []Job  `json:"jobs"`
	NextCursor string `json:"nextCursor,omitempty"`
}

// ListWorkers asks for the live workers.
type ListWorkers struct{}

// WorkerList answers ListWorkers, sorted by worker id.
type WorkerList struct {
	Workers []Worker `json:"workers"`
}

// CancelJob asks to cancel a job.
type CancelJob struct {
	JobID string `json:"jobId"`
}

// JobCancel answers CancelJob: Cancelled is true only if this call moved the job to CANCELLED.
type JobCancel struct {
	Cancelled bool `json:"cancelled"`
	Job       Job  `json:"job"`
}

// Job is a job snapshot.
type Job struct {
	JobID           string   `json:"jobId"`
	TaskType        string   `json:"taskType"`
	State           State    `json:"state"`
	Attempts        int      `json:"attempts"`
	MaxAttempts     int      `json:"maxAttempts"`
	WorkerID        *string  `json:"workerId"`
	Result          *string  `json:"result"`
	Error           *string  `json:"error"`
	CreatedAtMillis int64    `json:"createdAtMillis"`
	UpdatedAtMillis int64    `json:"updatedAtMillis"`
	Priority        Priority `json:"priority"`
	// LastWorkerID (an extension spec peers ignore) is the worker of the job's latest
	// attempt that ended, while the job is not RUNNING: which worker ran a finished job.
	LastWorkerID *string `json:"lastWorkerId,omitempty"`

	// Extensions of time, queues, workflows and progress (docs/PROTOCOL.md "Extensions").
	Queue           string   `json:"queue,omitempty"`
	RunAtMillis     int64    `json:"runAtMillis,omitempty"`
	Snoozes         int      `json:"snoozes,omitempty"` // how often its handler snoozed it
	Schedule        string   `json:"schedule,omitempty"`
	After           []string `json:"after,omitempty"`
	WorkflowID      string   `json:"workflowId,omitempty"`
	Step            string   `json:"step,omitempty"`
	BatchID         string   `json:"batchId,omitempty"`
	Progress        *float64 `json:"progress,omitempty"`
	ProgressMessage string   `json:"progressMessage,omitempty"`
	// Parents (workflows' extension) are the outcomes of the jobs in After, in a job
	// status answer (not in lists).
	Parents []ParentResult `json:"parents,omitempty"`
}

// RanBy is the worker of the job's current attempt, else of its latest one, else "".
func (j *Job) RanBy() string {
	switch {
	case j.WorkerID != nil:
		return *j.WorkerID
	case j.LastWorkerID != nil:
		return *j.LastWorkerID
	}
	return ""
}

// Worker is a live worker's snapshot.
type Worker struct {
	WorkerID            string `json:"workerId"`
	Capacity            int    `json:"capacity"`
	ActiveTasks         int    `json:"activeTasks"`
	LastHeartbeatMillis int64  `json:"lastHeartbeatMillis"`
}

// MessageType and MarshalJSON for every message. The local alias types drop the
// methods so that encode marshals the plain fields.

func (WorkerRegister) MessageType() Type   { return TypeWorkerRegister }
func (WorkerRegistered) MessageType() Type { return TypeWorkerRegistered }
func (Heartbeat) MessageType() Type        { return TypeHeartbeat }
func (TaskAssign) MessageType() Type       { return TypeTaskAssign }
func (TaskCancel) MessageType() Type       { return TypeTaskCancel }
func (TaskResult) MessageType() Type       { return TypeTaskResult }
func (Error) MessageType() Type            { return TypeError }
func (SubmitJob) MessageType() Type        { return TypeSubmitJob }
func (JobSubmitted) MessageType() Type     { return TypeJobSubmitted }
func (SubmitRejected) MessageType() Type   { return TypeSubmitRejected }
func (GetJobStatus) MessageType() Type     { return TypeGetJobStatus }
func (JobStatus) MessageType() Type        { return TypeJobStatus }
func (ListJobs) MessageType() Type         { return TypeListJobs }
func (JobList) MessageType() Type          { return TypeJobList }
func (ListWorkers) MessageType() Type      { return TypeListWorkers }
func (WorkerList) MessageType() Type       { return TypeWorkerList }
func (CancelJob) MessageType() Type        { return TypeCancelJob }
func (JobCancel) MessageType() Type        { return TypeJobCancel }

func (m WorkerRegister) MarshalJSON() ([]byte, error) {
	type plain WorkerRegister
	return encode(m.MessageType(), plain(m))
}

func (m WorkerRegistered) MarshalJSON() ([]byte, error) {
	type plain WorkerRegistered
	return encode(m.MessageType(), plain(m))
}

func (m Heartbeat) MarshalJSON() ([]byte, error) {
	type plain Heartbeat
	return encode(m.MessageType(), plain(m))
}

// marshalSlow is encoding/json's encoding, for what the fast one (hotcodec.go) leaves.
func (m TaskAssign) marshalSlow() ([]byte, error) {
	type plain TaskAssign
	if m.Payload == nil {
		m.Payload = json.RawMessage("null")
	}
	return encode(m.MessageType(), plain(m))
}

func (m TaskCancel) MarshalJSON() ([]byte, error) {
	type plain TaskCancel
	return encode(m.MessageType(), plain(m))
}

// marshalSlow is encoding/json's encoding, for what the fast one (hotcodec.go) leaves.
func (m TaskResult) marshalSlow() ([]byte, error) {
	type plain TaskResult
	return encode(m.MessageType(), plain(m))
}

func (m Error) MarshalJSON() ([]byte, error) {
	type plain Error
	return encode(m.MessageType(), plain(m))
}

// marshalSlow is encoding/json's encoding, for what the fast one (hotcodec.go) leaves.
func (m SubmitJob) marshalSlow() ([]byte, error) {
	type plain SubmitJob
	if m.Payload == nil {
		m.Payload = json.RawMessage("null")
	}
	return encode(m.MessageType(), plain(m))
}

// marshalSlow is encoding/json's encoding, for what the fast one (hotcodec.go) leaves.
func (m JobSubmitted) marshalSlow() ([]byte, error) {
	type plain JobSubmitted
	return encode(m.MessageType(), plain(m))
}

func (m SubmitRejected) MarshalJSON() ([]byte, error) {
	type plain SubmitRejected
	return encode(m.MessageType(), plain(m))
}

func (m GetJobStatus) MarshalJSON() ([]byte, error) {
	type plain GetJobStatus
	return encode(m.MessageType(), plain(m))
}

func (m JobStatus) MarshalJSON() ([]byte, error) {
	type plain JobStatus
	m.Job.Priority = snapshotPriority(m.Job.Priority)
	return encode(m.MessageType(), plain(m))
}

func (m ListJobs) MarshalJSON() ([]byte, error) {
	type plain ListJobs
	return encode(m.MessageType(), plain(m))
}

func (m JobList) MarshalJSON() ([]byte, error) {
	type plain JobList
	if m.Jobs == nil {
		m.Jobs = []Job{}
	}
	m.Jobs = withPriorities(m.Jobs)
	return encode(m.MessageType(), plain(m))
}

func (m ListWorkers) MarshalJSON() ([]byte, error) {
	return encode(m.MessageType(), struct{}{})
}

func (m WorkerList) MarshalJSON() ([]byte, error) {
	type plain WorkerList
	if m.Workers == nil {
		m.Workers = []Worker{}
	}
	return encode(m.MessageType(), plain(m))
}

func (m CancelJob) MarshalJSON() ([]byte, error) {
	type plain CancelJob
	return encode(m.MessageType(), plain(m))
}

func (m JobCancel) MarshalJSON() ([]byte, error) {
	type plain JobCancel
	m.Job.Priority = snapshotPriority(m.Job.Priority)
	return encode(m.MessageType(), plain(m))
}

// A snapshot always carries a base priority on the wire; an unset one (a Job built
// without it, or decoded from a peer that left it out or sent null) means NORMAL, as
// for SUBMIT_JOB. Encoding "" would write a frame Decode rejects.
func snapshotPriority(p Priority) Priority {
	if p == "" {
		return PriorityNormal
	}
	return p
}

// withPriorities returns jobs with every unset priority NORMAL, copying the slice
// only when one is unset so that the caller's jobs are never modified.
func withPriorities(jobs []Job) []Job {
	for i := range jobs {
		if jobs[i].Priority == "" {
			out := slices.Clone(jobs)
			for k := i; k < len(out); k++ {
				out[k].Priority = snapshotPriority(out[k].Priority)
			}
			return out
		}
	}
	return jobs
}

// normalize gives a decoded message the values Encode writes, so that decoding is
// stable under a round trip: a JSON null payload becomes nil (what Encode writes as
// null) and a snapshot's unset priority becomes NORMAL.
func normalize(m Message) {
	switch m := m.(type) {
	case *TaskAssign:
		m.Payload = nilIfNull(m.Payload)
	case *SubmitJob:
		m.Payload = nilIfNull(m.Payload)
	case *JobStatus:
		m.Job.Priority = snapshotPriority(m.Job.Priority)
	case *JobCancel:
		m.Job.Priority = snapshotPriority(m.Job.Priority)
	case *JobList:
		for i := range m.Jobs {
			m.Jobs[i].Priority = snapshotPriority(m.Jobs[i].Priority)
		}
	}
}

func nilIfNull(raw json.RawMessage) json.RawMessage {
	if string(raw) == "null" {
		return nil
	}
	return raw
}

// Worker names the worker a request of the worker protocol speaks for; the
// coordinator takes it only from that worker.
func (m *WorkerRegister) Worker() string { return m.WorkerID }

// Worker names the worker the heartbeat is for.
func (m *Heartbeat) Worker() string { return m.WorkerID }

// Worker names the worker that drains.
func (m *Drain) Worker() string { return m.WorkerID }

// Worker names the worker that leaves.
func (m *Disconnect) Worker() string { return m.WorkerID }

// Worker names the worker that reports the result.
func (m *TaskResult) Worker() string { return m.WorkerID }
