package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// Causes of an attempt's cancellation; the text of the first two becomes the error of
// its result.
var (
	errCancelled = errors.New("attempt cancelled by the coordinator")
	errAbandoned = errors.New("attempt abandoned: the worker registered again")
	errShutdown  = errors.New("worker shutting down")
)

// lease identifies an attempt: the coordinator counts only the result of a job's
// current attempt id.
type lease struct {
	jobID, attemptID string
}

// attempt is an attempt executing now.
type attempt struct {
	lease
	session uint64 // the registration it was assigned under
	cancel  context.CancelCauseFunc
}

// onAssign starts an assigned attempt. The coordinator counts the worker's free slots
// itself, so an assignment is never refused for capacity, only noted.
func (w *Worker) onAssign(_ context.Context, _ bus.Address, m protocol.TaskAssign) (struct{}, error) {
	if m.JobID == "" || m.AttemptID == "" {
		return struct{}{}, fmt.Errorf("assignment without jobId or attemptId")
	}
	l := lease{m.JobID, m.AttemptID}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case !w.accepting:
		w.log.Debug("assignment ignored: worker stopping", "job", m.JobID, "attempt", m.AttemptID)
		return struct{}{}, nil
	case w.attempts[l] != nil:
		w.log.Debug("duplicate assignment ignored", "job", m.JobID, "attempt", m.AttemptID)
		return struct{}{}, nil
	case len(w.attempts) >= w.cfg.capacity:
		w.log.Warn("assignment beyond capacity", "job", m.JobID, "attempt", m.AttemptID,
			"running", len(w.attempts), "capacity", w.cfg.capacity)
	}
	ctx, cancel := context.WithCancelCause(w.runCtx)
	a := &attempt{lease: l, session: w.session, cancel: cancel}
	w.attempts[l] = a
	w.wg.Add(1)
	go w.execute(ctx, a, &m)
	return struct{}{}, nil
}

// onCancel cancels an attempt, only if it is the one running under that lease: a
// cancel of a superseded attempt must not touch a newer attempt of the same job.
func (w *Worker) onCancel(_ context.Context, _ bus.Address, m protocol.TaskCancel) (struct{}, error) {
	w.mu.Lock()
	a := w.attempts[lease{m.JobID, m.AttemptID}]
	w.mu.Unlock()
	if a == nil {
		w.log.Debug("cancel ignored: attempt not running", "job", m.JobID, "attempt", m.AttemptID)
		return struct{}{}, nil
	}
	a.cancel(errCancelled)
	w.log.Debug("attempt cancelled", "job", m.JobID, "attempt", m.AttemptID)
	return struct{}{}, nil
}

// execute runs an attempt and reports its outcome. An attempt cut short by the worker's
// shutdown reports nothing: the worker's goodbye tells the coordinator instead.
func (w *Worker) execute(ctx context.Context, a *attempt, m *protocol.TaskAssign) {
	defer w.wg.Done()
	log := w.log.With("job", m.JobID, "attempt", m.AttemptID)
	log.Debug("attempt started", "task", m.TaskType, "number", m.AttemptNumber)
	out, err := w.runTask(ctx, m)
	if err != nil && ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	w.finish(a)
	if errors.Is(err, errShutdown) {
		log.Debug("attempt stopped by shutdown")
		return
	}
	res := &protocol.TaskResult{WorkerID: w.cfg.id, JobID: m.JobID, AttemptID: m.AttemptID, Success: err == nil}
	if err == nil {
		res.Result = &out
	} else {
		text := err.Error()
		res.Error = &text
	}
	log.Debug("attempt finished", "success", res.Success, "err", err)
	w.report(log, res)
}

// runTask runs the task, turning a panic into the attempt's failure.
func (w *Worker) runTask(ctx context.Context, m *protocol.TaskAssign) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			w.log.Error("task panicked", "job", m.JobID, "attempt", m.AttemptID, "task", m.TaskType,
				"panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("task %s panicked: %v", m.TaskType, r)
		}
	}()
	return w.cfg.registry.Run(ctx, m.TaskType, m.AttemptNumber, m.Payload)
}

// finish forgets an attempt that has returned and releases its context.
func (w *Worker) finish(a *attempt) {
	w.mu.Lock()
	if w.attempts[a.lease] == a {
		delete(w.attempts, a.lease)
	}
	w.mu.Unlock()
	a.cancel(context.Canceled)
}

// report delivers a result, repeating the ask until the coordinator answers: its answer
// comes once the outcome is durable, so a result survives a coordinator restart or
// failover. An error answer also ends the retries: the coordinator has decided.
func (w *Worker) report(log *slog.Logger, res *protocol.TaskResult) {
	b := backoff{next: w.cfg.retryBase, max: w.cfg.retryMax}
	for try := 1; ; try++ {
		ack, err := bus.Ask[protocol.ResultAck](w.sendCtx, w.node, coordinator, protocol.PathResult, res)
		switch {
		case err == nil:
			log.Debug("result acknowledged", "accepted", ack.Accepted, "tries", try)
			return
		case errors.Is(err, bus.ErrRemote):
			log.Warn("result refused by the coordinator", "err", err)
			return
		case w.sendCtx.Err() != nil || errors.Is(err, bus.ErrClosed):
			log.Warn("result not delivered", "err", err)
			return
		case !errors.Is(err, bus.ErrNoPeer) && !errors.Is(err, bus.ErrTimeout) && !errors.Is(err, bus.ErrDisconnected):
			log.Error("result not deliverable", "err", err)
			return
		}
		log.Debug("result not acknowledged; retrying", "err", err, "try", try)
		if !sleep(w.sendCtx, b.delay()) {
			log.Warn("result not delivered: worker stopped", "tries", try)
			return
		}
	}
}
