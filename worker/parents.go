package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// attemptKey carries the running attempt, a *run, in a handler's context.
type attemptKey struct{}

// ErrNoAttempt: the context is not a handler's (ParentResults).
var ErrNoAttempt = errors.New("worker: not a handler's context")

// JobID is the id of the job whose attempt ctx belongs to, "" outside a handler.
func JobID(ctx context.Context) string {
	if r, ok := ctx.Value(attemptKey{}).(*run); ok {
		return r.m.JobID
	}
	return ""
}

// ParentResults returns the outcomes of the jobs the running job waited for (its
// parents, client.After; a workflow step's parent steps), in the order they were
// named: each one's id, step name, state and result. A job that waited for nothing
// has none; a parent no longer kept (its retention ended before the job ran) has
// state UNKNOWN and no result. It asks the coordinator (the job's status on the NATS API), so ctx bounds
// it; ctx must be the handler's. A result the job's status left out to fit in one
// message (ResultOmitted) is read from its parent's own status.
func ParentResults(ctx context.Context) ([]protocol.ParentResult, error) {
	r, ok := ctx.Value(attemptKey{}).(*run)
	if !ok {
		return nil, ErrNoAttempt
	}
	c := client.New(r.w.node.Conn())
	job, err := c.Status(ctx, r.m.JobID)
	if err != nil {
		return nil, fmt.Errorf("parent results of job %s: %w", r.m.JobID, err)
	}
	for i := range job.Parents {
		if p := &job.Parents[i]; p.ResultOmitted {
			if err := readParentResult(ctx, c, p); err != nil {
				return nil, fmt.Errorf("parent results of job %s: parent %s: %w", r.m.JobID, p.JobID, err)
			}
		}
	}
	return job.Parents, nil
}

// readParentResult fills in p's result from its own status; a parent no longer kept
// reads UNKNOWN, as in a status.
func readParentResult(ctx context.Context, c *client.Client, p *protocol.ParentResult) error {
	parent, err := c.Status(ctx, p.JobID)
	var se *client.ServerError
	switch {
	case errors.As(err, &se) && strings.HasPrefix(se.Message, protocol.UnknownJob("").Message):
		p.State = protocol.StateUnknown
	case err != nil:
		return err
	default:
		p.Result = parent.Result
	}
	p.ResultOmitted = false
	return nil
}
