package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// attemptKey carries the running attempt in a handler's context.
type attemptKey struct{}

type attemptInfo struct {
	jobID string
	w     *Worker
}

// ErrNoAttempt: the context is not a handler's (ParentResults).
var ErrNoAttempt = errors.New("worker: not a handler's context")

// JobID is the id of the job whose attempt ctx belongs to, "" outside a handler.
func JobID(ctx context.Context) string {
	if a, ok := ctx.Value(attemptKey{}).(*attemptInfo); ok {
		return a.jobID
	}
	return ""
}

// ParentResults returns the outcomes of the jobs the running job waited for (its
// parents, client.After; a workflow step's parent steps), in the order they were
// named: each one's id, step name, state and result. A job that waited for nothing
// has none. It asks the coordinator (the job's status on the NATS API), so ctx bounds
// it; ctx must be the handler's.
func ParentResults(ctx context.Context) ([]protocol.ParentResult, error) {
	a, ok := ctx.Value(attemptKey{}).(*attemptInfo)
	if !ok || a.w == nil {
		return nil, ErrNoAttempt
	}
	job, err := client.New(a.w.node.Conn()).Status(ctx, a.jobID)
	if err != nil {
		return nil, fmt.Errorf("parent results of job %s: %w", a.jobID, err)
	}
	return job.Parents, nil
}

// attemptContext is the context an attempt of job id runs under.
func (w *Worker) attemptContext(id string) context.Context {
	return context.WithValue(context.Background(), attemptKey{}, &attemptInfo{jobID: id, w: w})
}
