package protocol

import (
	"encoding/json"
	"fmt"
	"regexp"
)

// Workflows and batches (native extensions of the client API; spec peers never send
// them). A workflow is a DAG of named steps, each a job, submitted in one request and
// stored all or nothing; a batch is a set of jobs with callbacks: a job run once all
// completed (onSuccess) and one run once all ended (onComplete). Both are groups: the
// jobs of one carry its id (Record.WorkflowID or Record.BatchID) and their step name
// (Record.Step).

// Message types of workflows and batches.
const (
	TypeSubmitWorkflow    Type = "SUBMIT_WORKFLOW"
	TypeWorkflowSubmitted Type = "WORKFLOW_SUBMITTED"
	TypeGetWorkflow       Type = "GET_WORKFLOW"
	TypeWorkflowStatus    Type = "WORKFLOW_STATUS"
	TypeCancelWorkflow    Type = "CANCEL_WORKFLOW"
	TypeWorkflowCancelled Type = "WORKFLOW_CANCELLED"
	TypeRetryWorkflow     Type = "RETRY_WORKFLOW"
	TypeWorkflowRetried   Type = "WORKFLOW_RETRIED"
)

// Bounds of a workflow.
const (
	// MaxWorkflowSteps bounds the steps of one workflow or batch.
	MaxWorkflowSteps = 10_000
	// MaxStepNameBytes bounds a step's name.
	MaxStepNameBytes = 64
)

// Group kinds.
const (
	KindWorkflow = "workflow"
	KindBatch    = "batch"
)

// The step names of a batch's callbacks.
const (
	StepOnSuccess  = "on-success"
	StepOnComplete = "on-complete"
)

// WorkflowStep is one step of a submitted workflow: a job's type, payload and options,
// and the steps it waits for.
type WorkflowStep struct {
	Name        string          `json:"name"`
	TaskType    string          `json:"taskType"`
	Payload     json.RawMessage `json:"payload"`
	MaxAttempts int             `json:"maxAttempts,omitempty"`
	Priority    *Priority       `json:"priority,omitempty"`
	// After names the steps this one waits for; AfterAnyEnd runs it once they ended
	// whatever way, instead of only once they all COMPLETED.
	After       []string `json:"after,omitempty"`
	AfterAnyEnd bool     `json:"afterAnyEnd,omitempty"`
}

// SubmitWorkflow submits a workflow or a batch. Edges ([from, to] step names) and Chain
// (each step after the one before it) add to the steps' own After. For a batch (Kind
// "batch"), Steps are its jobs, which wait for nothing, and OnSuccess and OnComplete
// its callbacks, each a step without a name. An id left empty is chosen by the
// coordinator; a workflow submitted again with the same id and definition is answered
// as the first time.
type SubmitWorkflow struct {
	WorkflowID string         `json:"workflowId,omitempty"`
	Kind       string         `json:"kind,omitempty"` // "workflow" (default) or "batch"
	Steps      []WorkflowStep `json:"steps"`
	Edges      [][2]string    `json:"edges,omitempty"`
	Chain      []string       `json:"chain,omitempty"`
	OnSuccess  *WorkflowStep  `json:"onSuccess,omitempty"`
	OnComplete *WorkflowStep  `json:"onComplete,omitempty"`
}

// WorkflowSubmitted answers SubmitWorkflow: the id and each step's job id.
type WorkflowSubmitted struct {
	WorkflowID string            `json:"workflowId"`
	Jobs       map[string]string `json:"jobs"`
}

// GetWorkflow asks for a workflow's or batch's state.
type GetWorkflow struct {
	WorkflowID string `json:"workflowId"`
}

// WorkflowStatus answers GetWorkflow. State is RUNNING while a step is active, else
// COMPLETED when every step completed, FAILED when one failed, CANCELLED when one was
// cancelled, UNKNOWN otherwise (a step's record expired: its end is not known).
// Counts are the steps by state (a batch's progress). Steps are in submission order;
// Truncated says some were left out to fit one message (Counts has them all).
type WorkflowStatus struct {
	WorkflowID      string        `json:"workflowId"`
	Kind            string        `json:"kind"`
	State           string        `json:"state"`
	CreatedAtMillis int64         `json:"createdAtMillis"`
	Counts          map[State]int `json:"counts"`
	Steps           []StepStatus  `json:"steps"`
	Truncated       bool          `json:"truncated,omitempty"`
}

// StepStatus is one step of a WorkflowStatus.
type StepStatus struct {
	Name  string   `json:"name"`
	JobID string   `json:"jobId"`
	State State    `json:"state"`
	After []string `json:"after,omitempty"` // step names
	Error *string  `json:"error,omitempty"`
}

// CancelWorkflow cancels every step of a workflow not yet ended.
type CancelWorkflow struct {
	WorkflowID string `json:"workflowId"`
}

// WorkflowCancelled answers CancelWorkflow: how many steps the workflow's cancel
// cancelled (this call's and any earlier one's, so that a cancel sent again is
// answered as the first).
type WorkflowCancelled struct {
	WorkflowID string `json:"workflowId"`
	Cancelled  int    `json:"cancelled"`
	// Kind is the group's, KindWorkflow or KindBatch, so that a client names it as
	// it is; "" from a coordinator that did not say (a workflow's wording then).
	Kind string `json:"kind,omitempty"`
}

// RetryWorkflow runs again the steps of a workflow that failed or were cancelled, and
// the steps that waited on them: each as a new job.
type RetryWorkflow struct {
	WorkflowID string `json:"workflowId"`
}

// WorkflowRetried answers RetryWorkflow: the new job of each step run again.
type WorkflowRetried struct {
	WorkflowID string            `json:"workflowId"`
	Jobs       map[string]string `json:"jobs"`
	Kind       string            `json:"kind,omitempty"` // as WorkflowCancelled's
}

// ParentResult is a parent's outcome as the snapshot of a job that waited for it
// shows it (Job.Parents). ResultOmitted says the parent has a result that was left out
// to keep the status within one message; the parent's own status has it.
type ParentResult struct {
	JobID         string  `json:"jobId"`
	Step          string  `json:"step,omitempty"`
	State         State   `json:"state"`
	Result        *string `json:"result,omitempty"`
	ResultOmitted bool    `json:"resultOmitted,omitempty"`
}

var stepName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// ValidStepName reports whether name may name a step: 1 to MaxStepNameBytes letters,
// digits, '-' or '_' (it is a KV key token and a subject token).
func ValidStepName(name string) error {
	if name == "" || len(name) > MaxStepNameBytes || !stepName.MatchString(name) {
		return fmt.Errorf("step name %q must be 1 to %d letters, digits, '-' or '_'", name, MaxStepNameBytes)
	}
	return nil
}

// ValidWorkflowID reports whether id may name a workflow (as a step name may).
func ValidWorkflowID(id string) error {
	if id == "" || len(id) > MaxStepNameBytes || !stepName.MatchString(id) {
		return fmt.Errorf("workflow id %q must be 1 to %d letters, digits, '-' or '_'", id, MaxStepNameBytes)
	}
	return nil
}

func (SubmitWorkflow) MessageType() Type    { return TypeSubmitWorkflow }
func (WorkflowSubmitted) MessageType() Type { return TypeWorkflowSubmitted }
func (GetWorkflow) MessageType() Type       { return TypeGetWorkflow }
func (WorkflowStatus) MessageType() Type    { return TypeWorkflowStatus }
func (CancelWorkflow) MessageType() Type    { return TypeCancelWorkflow }
func (WorkflowCancelled) MessageType() Type { return TypeWorkflowCancelled }
func (RetryWorkflow) MessageType() Type     { return TypeRetryWorkflow }
func (WorkflowRetried) MessageType() Type   { return TypeWorkflowRetried }

func (m SubmitWorkflow) MarshalJSON() ([]byte, error) {
	type plain SubmitWorkflow
	if m.Steps == nil {
		m.Steps = []WorkflowStep{}
	}
	return encode(m.MessageType(), plain(m))
}

func (m WorkflowSubmitted) MarshalJSON() ([]byte, error) {
	type plain WorkflowSubmitted
	if m.Jobs == nil {
		m.Jobs = map[string]string{}
	}
	return encode(m.MessageType(), plain(m))
}

func (m GetWorkflow) MarshalJSON() ([]byte, error) {
	type plain GetWorkflow
	return encode(m.MessageType(), plain(m))
}

func (m WorkflowStatus) MarshalJSON() ([]byte, error) {
	type plain WorkflowStatus
	if m.Steps == nil {
		m.Steps = []StepStatus{}
	}
	if m.Counts == nil {
		m.Counts = map[State]int{}
	}
	return encode(m.MessageType(), plain(m))
}

func (m CancelWorkflow) MarshalJSON() ([]byte, error) {
	type plain CancelWorkflow
	return encode(m.MessageType(), plain(m))
}

func (m WorkflowCancelled) MarshalJSON() ([]byte, error) {
	type plain WorkflowCancelled
	return encode(m.MessageType(), plain(m))
}

func (m RetryWorkflow) MarshalJSON() ([]byte, error) {
	type plain RetryWorkflow
	return encode(m.MessageType(), plain(m))
}

func (m WorkflowRetried) MarshalJSON() ([]byte, error) {
	type plain WorkflowRetried
	if m.Jobs == nil {
		m.Jobs = map[string]string{}
	}
	return encode(m.MessageType(), plain(m))
}
