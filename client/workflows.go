package client

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jobbus/jobbus/bus/protocol"
)

// After makes the job wait (WAITING) for the jobs ids: it becomes QUEUED once every one
// of them COMPLETED, and is CANCELLED, naming the parent, if one ends otherwise. The
// parents must exist. Its handler reads their results with worker.ParentResults.
func After(ids ...string) SubmitOption {
	return func(s *protocol.SubmitJob) { s.After = append(s.After, ids...) }
}

// AfterAnyEnd, with After, runs the job once its parents ended, whatever way.
func AfterAnyEnd() SubmitOption { return func(s *protocol.SubmitJob) { s.AfterAnyEnd = true } }

// Workflow builds a workflow: named steps, each a job, and the edges between them. It
// is submitted in one request and stored all or nothing (Client.SubmitWorkflow).
type Workflow struct {
	req protocol.SubmitWorkflow
	err error
}

// NewWorkflow starts a workflow with id ("": the client picks one when it is first
// submitted, SubmitWorkflowRequest).
func NewWorkflow(id string) *Workflow {
	return &Workflow{req: protocol.SubmitWorkflow{WorkflowID: id, Kind: protocol.KindWorkflow}}
}

// NewBatch starts a batch with id ("": the client picks one, as NewWorkflow): jobs added with Step
// wait for nothing, and OnSuccess and OnComplete set its callbacks.
func NewBatch(id string) *Workflow {
	return &Workflow{req: protocol.SubmitWorkflow{WorkflowID: id, Kind: protocol.KindBatch}}
}

// StepOption sets an option of a workflow step.
type StepOption func(*protocol.WorkflowStep)

// StepAfter makes the step wait for the steps named.
func StepAfter(names ...string) StepOption {
	return func(s *protocol.WorkflowStep) { s.After = append(s.After, names...) }
}

// StepAfterAnyEnd runs the step once its parents ended, whatever way.
func StepAfterAnyEnd() StepOption { return func(s *protocol.WorkflowStep) { s.AfterAnyEnd = true } }

// StepMaxAttempts sets the step's maxAttempts.
func StepMaxAttempts(n int) StepOption { return func(s *protocol.WorkflowStep) { s.MaxAttempts = n } }

// StepPriority sets the step's priority.
func StepPriority(p protocol.Priority) StepOption {
	return func(s *protocol.WorkflowStep) { s.Priority = &p }
}

func step(name, taskType string, payload any, opts []StepOption) (protocol.WorkflowStep, error) {
	raw, ok := payload.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(payload); err != nil {
			return protocol.WorkflowStep{}, fmt.Errorf("step %s: encode payload: %w", name, err)
		}
	}
	st := protocol.WorkflowStep{Name: name, TaskType: taskType, Payload: raw}
	for _, o := range opts {
		o(&st)
	}
	return st, nil
}

// Step adds a step (a batch's job).
func (w *Workflow) Step(name, taskType string, payload any, opts ...StepOption) *Workflow {
	st, err := step(name, taskType, payload, opts)
	if err != nil && w.err == nil {
		w.err = err
	}
	w.req.Steps = append(w.req.Steps, st)
	return w
}

// Edge makes step to wait for step from.
func (w *Workflow) Edge(from, to string) *Workflow {
	w.req.Edges = append(w.req.Edges, [2]string{from, to})
	return w
}

// Chain makes each step named wait for the one before it: a -> b -> c.
func (w *Workflow) Chain(names ...string) *Workflow {
	w.req.Chain = slices.Clone(names)
	return w
}

// OnSuccess sets a batch's callback run once all its jobs completed.
func (w *Workflow) OnSuccess(taskType string, payload any, opts ...StepOption) *Workflow {
	st, err := step(protocol.StepOnSuccess, taskType, payload, opts)
	if err != nil && w.err == nil {
		w.err = err
	}
	w.req.OnSuccess = &st
	return w
}

// OnComplete sets a batch's callback run once all its jobs ended; its payload gets
// "batch": {"batchId", "total", "completed", "failed", "cancelled"}.
func (w *Workflow) OnComplete(taskType string, payload any, opts ...StepOption) *Workflow {
	st, err := step(protocol.StepOnComplete, taskType, payload, opts)
	if err != nil && w.err == nil {
		w.err = err
	}
	w.req.OnComplete = &st
	return w
}

// Request is the SUBMIT_WORKFLOW the builder made.
func (w *Workflow) Request() (*protocol.SubmitWorkflow, error) { return &w.req, w.err }

// SubmitWorkflow submits a workflow or batch built with NewWorkflow or NewBatch and
// returns its id and each step's job id once every job is stored; on an error none is,
// unless it is ErrOutcomeUnknown (the coordinator could not tell in time, or, over
// NATS, the context ended or the connection went before its answer came): then all
// may be, and the coordinator runs them once it knows they are; OutcomeWorkflow names
// the workflow. Sending the same
// workflow again is safe: it is answered with its jobs once they are stored.
func (c *Client) SubmitWorkflow(ctx context.Context, w *Workflow) (protocol.WorkflowSubmitted, error) {
	req, err := w.Request()
	if err != nil {
		return protocol.WorkflowSubmitted{}, err
	}
	return c.SubmitWorkflowRequest(ctx, req)
}

// SubmitWorkflowRequest submits a SUBMIT_WORKFLOW as it is (a workflow file's), except
// that an empty WorkflowID is given one, in req: a submission whose outcome is unknown
// then names its workflow, and req sent again is that workflow, not a second one.
func (c *Client) SubmitWorkflowRequest(ctx context.Context, req *protocol.SubmitWorkflow) (protocol.WorkflowSubmitted, error) {
	if req.WorkflowID == "" {
		req.WorkflowID = protocol.RequestJobID(protocol.NewRequestID()) // a random UUID, as the coordinator's
	}
	m, err := c.Do(ctx, req)
	if err != nil {
		return protocol.WorkflowSubmitted{}, err
	}
	switch r := m.(type) {
	case *protocol.WorkflowSubmitted:
		return *r, nil
	case *protocol.SubmitRejected:
		return protocol.WorkflowSubmitted{}, &RejectedError{*r}
	}
	return protocol.WorkflowSubmitted{}, unexpected(m)
}

// WorkflowStatus returns a workflow's or batch's state and each step's.
func (c *Client) WorkflowStatus(ctx context.Context, id string) (protocol.WorkflowStatus, error) {
	r, err := answer[protocol.WorkflowStatus](ctx, c, &protocol.GetWorkflow{WorkflowID: id})
	if err != nil {
		return protocol.WorkflowStatus{}, err
	}
	return *r, nil
}

// WaitWorkflow polls a workflow until no step is active or ctx ends.
func (c *Client) WaitWorkflow(ctx context.Context, id string) (protocol.WorkflowStatus, error) {
	for poll := waitPoll.Start(); ; {
		st, err := c.WorkflowStatus(ctx, id)
		if err != nil {
			return st, err
		}
		if st.State != "RUNNING" {
			return st, nil
		}
		if !poll.Wait(ctx) {
			return st, fmt.Errorf("wait for workflow %s (%s): %w", id, st.State, ctx.Err())
		}
	}
}

// CancelWorkflow cancels every step not yet ended and returns how many the workflow's
// cancel did (a cancel sent again is answered as the first). An error matching
// ErrOutcomeUnknown (the coordinator could not tell in time, or, over NATS, the context
// ended or the connection went before its answer came) means the cancel may or may
// not have been applied; sending it again is safe.
func (c *Client) CancelWorkflow(ctx context.Context, id string) (int, error) {
	r, err := c.CancelWorkflowRequest(ctx, id)
	return r.Cancelled, err
}

// CancelWorkflowRequest is CancelWorkflow, returning the coordinator's whole answer:
// with the group's kind (a workflow or a batch).
func (c *Client) CancelWorkflowRequest(ctx context.Context, id string) (protocol.WorkflowCancelled, error) {
	r, err := answer[protocol.WorkflowCancelled](ctx, c, &protocol.CancelWorkflow{WorkflowID: id})
	if err != nil {
		return protocol.WorkflowCancelled{}, err
	}
	return *r, nil
}

// RetryWorkflow runs again, as new jobs, the steps of an ended workflow that failed or
// were cancelled; it returns each one's new job id. An error matching ErrOutcomeUnknown
// (the coordinator could not tell in time, or, over NATS, the context ended or the
// connection went before its answer came) means the retry may or may not have been
// applied: WorkflowStatus shows its steps' new jobs if it was. Do not simply send it again: it is refused while those
// steps run, and runs again those that failed or were cancelled by then.
func (c *Client) RetryWorkflow(ctx context.Context, id string) (map[string]string, error) {
	r, err := c.RetryWorkflowRequest(ctx, id)
	return r.Jobs, err
}

// RetryWorkflowRequest is RetryWorkflow, returning the coordinator's whole answer:
// with the group's kind (a workflow or a batch).
func (c *Client) RetryWorkflowRequest(ctx context.Context, id string) (protocol.WorkflowRetried, error) {
	r, err := answer[protocol.WorkflowRetried](ctx, c, &protocol.RetryWorkflow{WorkflowID: id})
	if err != nil {
		return protocol.WorkflowRetried{}, err
	}
	return *r, nil
}
