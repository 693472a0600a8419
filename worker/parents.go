package worker

import (
	"context"
	"errors"
	"fmt"

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
// it; ctx must be the handler's.
func ParentResults(ctx context.Context) ([]protocol.ParentResult, error) {
	r, ok := ctx.Value(attemptKey{}).(*run)
	if !ok {
		return nil, ErrNoAttempt
	}
	job, err := client.New(r.w.node.Conn()).Status(ctx, r.m.JobID)
	if err != nil {
		return nil, fmt.Errorf("parent results of job %s: %w", r.m.JobID, err)
	}
	return job.Parents, nil
}
