package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/natsreq"
	"github.com/jobbus/jobbus/internal/natsurl"
)

// FailoverNotice is what a request says while it waits for a coordinator to take over
// (WithFailoverNotice).
const FailoverNotice = "no coordinator is serving right now (a failover takes about the leader lease); retrying"

// presenceWait bounds the question whether any coordinator process runs, asked when none
// serves the API: each answers at once.
const presenceWait = 500 * time.Millisecond

// WithFailoverNotice has the client call notice with FailoverNotice when a request finds
// no coordinator serving while a coordinator process runs (a standby about to take over,
// or a leader still recovering): the request then waits for one to serve, until its
// deadline, instead of failing at once. At most once per request.
func WithFailoverNotice(notice func(msg string)) Option {
	return func(c *Client) { c.notice = notice }
}

// request sends a client API request over NATS, within ctx or, when ctx has no
// deadline, within: natsreq.Request says which requests are sent again, and when.
// While nobody serves the API, the request waits for a coordinator only while a
// coordinator process runs (a standby about to take over, or a leader still
// recovering), and says so once (WithFailoverNotice); it fails at once while none does
// (jobbus is not running there). A write left unanswered (a submission, a cancel, a
// workflow's submission, cancel or retry, a schedule's, queue's or limit's command),
// whether its time ran out, its caller cancelled or its connection went, hears
// "Outcome unknown" naming its job (the one a submission's request id names), its
// workflow, or what it sets (unanswered).
func (n *natsTransport) request(ctx context.Context, t protocol.Type, subject string, body []byte, within time.Duration) (*nats.Msg, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // ended before anything was sent: nothing was stored
	}
	if n.nc.IsClosed() {
		return nil, nats.ErrConnectionClosed // nothing can be sent: nothing was stored
	}
	opts := natsreq.Options{Within: within, Nobody: n.nobodyFn}
	switch t {
	case protocol.TypeSubmitJob:
		opts.RequestID = protocol.NewRequestID()
		opts.Header = traceHeader(ctx) // trace.go
	case protocol.TypeSubmitJobs: // SubmitMany's
		// The batch's own id, for natsreq's sends again; each submission in it has
		// its own, which names its job. Nobody serving submit.many (an older
		// coordinator) is answered at once: SubmitMany then sends each alone, and
		// that waits out a failover.
		opts.RequestID = protocol.NewRequestID()
		opts.Header = traceHeader(ctx) // each submission's (the coordinator's rule)
		opts.Nobody = nil
		if sentAgain(ctx) { // its submissions' request ids went before (SubmitMany)
			if opts.Header == nil {
				opts.Header = nats.Header{}
			}
			opts.Header.Set(protocol.HeaderRequestTry, protocol.TryValue(2))
		}
	case protocol.TypeSubmitWorkflow, protocol.TypeRetryWorkflow:
		opts.Header = traceHeader(ctx) // its steps join the submitter's trace
	}
	msg, err := natsreq.Request(ctx, n.nc, subject, body, opts)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		// A coordinator process ran, but none served in time: nothing was received.
		err = fmt.Errorf("%w on %s: %s, but none took over in time", ErrNoCoordinator, natsurl.Connected(n.nc), noticeWithoutRetrying)
	case context.Cause(ctx) == ctx.Err() &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || cutOff(err)):
		// A send was taken and not answered, whether the time ran out, the caller
		// cancelled or the connection went: a write may have been acted on.
		err = unanswered(t, body, opts.RequestID, err)
	}
	return msg, err
}

// unanswered is the error of a request (t, body, requestID: a submission's) that was
// sent and went unanswered (err: its context ended, or its connection went). A write
// may have been acted on: its error says its outcome is unknown, and wraps
// context.Canceled when the caller cancelled. Any other request's is err.
func unanswered(t protocol.Type, body []byte, requestID string, err error) error {
	cause := "no reply from a coordinator in time"
	var refused *natsreq.RefusedError
	var cancelled error
	switch {
	case errors.Is(err, context.Canceled):
		cause, cancelled = "the request was cancelled before a coordinator replied", context.Canceled
	case cutOff(err) || errors.As(err, &refused):
		cause = err.Error()
	}
	if t == protocol.TypeSubmitJobs {
		return &batchUnanswered{cause: cause, err: cancelled} // SubmitMany names each submission's job
	}
	unknown := unknownOutcome(t, body, requestID, cause)
	switch {
	case unknown == nil:
		return err // a request that changes nothing
	case cancelled != nil:
		return fmt.Errorf("%w: %w", unknown, cancelled)
	}
	return unknown
}

// unknownOutcome is the "Outcome unknown" of a submission (its job named by requestID),
// a cancel, a workflow's submission, cancel or retry, or a schedule's, queue's or
// limit's command (t, body), sent and left unanswered for cause: it names the job or
// the workflow (OutcomeJob, OutcomeWorkflow), or the schedule, queue or limit, as the
// coordinator's own answer would, and says whether sending it again is safe. It is nil
// for a request that changes nothing.
func unknownOutcome(t protocol.Type, body []byte, requestID, cause string) *ServerError {
	var req struct {
		JobID      string `json:"jobId"`
		WorkflowID string `json:"workflowId"`
		Kind       string `json:"kind"`
		Name       string `json:"name"`  // a schedule's, a limit's
		Queue      string `json:"queue"` // a queue's
		Scope      string `json:"scope"` // a limit's
		Schedule   struct {
			Name string `json:"name"`
		} `json:"schedule"` // an added one
	}
	_ = json.Unmarshal(body, &req) // the client encoded it; a workflow's submission has its id (SubmitWorkflowRequest)
	var msg string
	switch t {
	case protocol.TypeSubmitJob:
		return &ServerError{Message: protocol.OutcomeUnknown("submission", protocol.RequestJobID(requestID), cause).Message}
	case protocol.TypeCancelJob:
		return &ServerError{Message: protocol.OutcomeUnknown("cancel", req.JobID, cause).Message}
	case protocol.TypeSubmitWorkflow:
		if req.Kind == "" {
			req.Kind = protocol.KindWorkflow
		}
		return &ServerError{Message: protocol.OutcomeUnknownGroup(req.Kind+" "+req.WorkflowID, cause).Message}
	case protocol.TypeCancelWorkflow:
		return &ServerError{Message: protocol.OutcomeUnknownGroupCancel(protocol.KindWorkflow, req.WorkflowID, cause).Message}
	case protocol.TypeRetryWorkflow:
		return &ServerError{Message: protocol.OutcomeUnknownGroup("retry of "+protocol.KindWorkflow+" "+req.WorkflowID, cause).Message}
	case protocol.TypeAddSchedule:
		// Sent again, an add makes no second schedule: the name is taken.
		msg = fmt.Sprintf("schedule %s may or may not be added (%s); sending the add again is safe: it adds no second one, and is refused as existing if this one was stored",
			req.Schedule.Name, cause)
	case protocol.TypeTriggerSchedule:
		return &ServerError{Message: protocol.OutcomeUnknownTrigger(req.Name, cause).Message}
	case protocol.TypePauseSchedule, protocol.TypeResumeSchedule:
		return &ServerError{Message: protocol.OutcomeUnknownSetting("schedule "+req.Name, "stored", cause).Message}
	case protocol.TypeRemoveSchedule:
		return &ServerError{Message: protocol.OutcomeUnknownSetting("schedule "+req.Name, "removed", cause).Message}
	case protocol.TypePauseQueue, protocol.TypeResumeQueue, protocol.TypeSetQueue:
		return &ServerError{Message: protocol.OutcomeUnknownSetting("the settings of queue "+req.Queue, "stored", cause).Message}
	case protocol.TypeSetLimit:
		return &ServerError{Message: protocol.OutcomeUnknownSetting("the limit of "+req.Scope+" "+req.Name, "stored", cause).Message}
	case protocol.TypeRemoveLimit:
		return &ServerError{Message: protocol.OutcomeUnknownSetting("the limit of "+req.Scope+" "+req.Name, "removed", cause).Message}
	default:
		return nil
	}
	return &ServerError{Message: protocol.OutcomeUnknownPrefix + msg}
}

// cutOff reports a request whose connection went down while it waited for its reply:
// a send may have been taken and acted on. natsreq says so (ErrCutOff) of a send
// again; of the first it passes on nats.go's word, which, the connection being open
// when the request began (request checks), may come after it went.
func cutOff(err error) bool {
	return errors.Is(err, natsreq.ErrCutOff) || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrDisconnected)
}

// nobody decides, when no coordinator serves, whether to wait for one: while a
// coordinator process runs (a failover), not otherwise.
func (n *natsTransport) nobody(ctx context.Context) error {
	if !n.coordinatorRuns(ctx) {
		return fmt.Errorf("%w on %s (is `jobbus serve` running?)", ErrNoCoordinator, natsurl.Connected(n.nc))
	}
	if n.notice != nil {
		n.notice(FailoverNotice)
	}
	return nil
}

var noticeWithoutRetrying = FailoverNotice[:len(FailoverNotice)-len("; retrying")]

// coordinatorRuns reports whether a coordinator process answers presence
// (protocol.CoordinatorsSubject): a standby, or a leader that is not serving yet.
func (n *natsTransport) coordinatorRuns(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, presenceWait)
	defer cancel()
	_, err := n.nc.RequestWithContext(ctx, protocol.CoordinatorsSubject, nil)
	return err == nil
}
