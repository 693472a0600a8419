package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/trace"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/jobctx"
	"github.com/jobbus/jobbus/internal/tracing"
	"github.com/jobbus/jobbus/worker/internal/attempts"
)

// Causes of an attempt's cancellation besides the coordinator's (attempts.ErrCancelled);
// the text of errAbandoned becomes the error of its result.
var (
	errAbandoned = errors.New("attempt abandoned: the worker registered again and the coordinator did not keep it")
	errShutdown  = errors.New("worker shutting down")
)

// onAssign starts an assigned attempt. The coordinator counts the worker's free slots
// itself, so an assignment is never refused for capacity, only noted; a duplicate, or
// one arriving while the worker stops, is ignored.
func (w *Worker) onAssign(_ context.Context, _ bus.Address, m protocol.TaskAssign) (struct{}, error) {
	if m.JobID == "" || m.AttemptID == "" {
		return struct{}{}, fmt.Errorf("assignment without jobId or attemptId")
	}
	r := w.newRun(&m)            // visibility.go; parents.go
	added := w.held.Add(r.ref()) // before it starts: it may finish at once
	w.inflight.add()
	if !w.attempts.Start(r, &r.m, r) {
		r.scope.end()
		if r.span != nil { // a duplicate, or the worker stops: it never ran
			r.span.SetAttributes(tracing.AttrOutcome.String("ignored"))
			r.span.End()
		}
		w.inflight.done()
		if added {
			w.held.Remove(r.ref())
		}
	}
	return struct{}{}, nil
}

// run is one assigned attempt on this worker, from its assignment to its result: the
// assignment, its span, and its scope (progress and log). It is also the context its
// handler runs under, below the Set's cancellation: it answers the attempt's own
// values (JobID, ParentResults; Progress, Logger) and hands every other question to
// the context it was started in (the submission's trace, its span). One allocation for
// what were eight per attempt: the assignment's copy, the two context values and what
// they held, the scope, the closure that finished the attempt, its result, and the
// Set's record of it.
type run struct {
	context.Context // the trace of the submission, and the span, over Background

	w      *Worker
	m      protocol.TaskAssign
	span   trace.Span // nil when not sampled
	scope  scope
	result attempts.ResultBuf
	slot   attempts.Slot // the Set's record of the attempt
}

// AttemptSlot is attempts.SlotHolder's: the Set keeps its record of the attempt here.
func (r *run) AttemptSlot() *attempts.Slot { return &r.slot }

// Value answers the attempt's values, then the parent's.
func (r *run) Value(key any) any {
	if _, ok := key.(attemptKey); ok {
		return r
	}
	if jobctx.IsKey(key) {
		return jobctx.Scope(&r.scope)
	}
	return r.Context.Value(key)
}

func (r *run) ref() protocol.AttemptRef {
	return protocol.AttemptRef{JobID: r.m.JobID, AttemptID: r.m.AttemptID}
}

// Finish is attempts.Finisher's: the attempt's result goes, after its last progress
// and log.
func (r *run) Finish(o attempts.Outcome) {
	w, ref := r.w, r.ref()
	defer w.inflight.done()
	defer w.held.Remove(ref) // its result is acknowledged, or given up
	w.held.Finished(ref)
	r.scope.end() // its last progress and log go before its result
	endSpan(r.span, o)
	w.finished(&r.m, &r.result, o)
}

// onAssigns starts the attempts of a batch of assignments (protocol.PathAssigns), each
// as onAssign would had it come alone, in the batch's order.
func (w *Worker) onAssigns(ctx context.Context, from bus.Address, m protocol.TaskAssigns) (struct{}, error) {
	var errs []error
	for i := range m.Assigns {
		if _, err := w.onAssign(ctx, from, m.Assigns[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return struct{}{}, errors.Join(errs...)
}

// onCancel cancels an attempt, only if it is the one running under that lease: a
// cancel of a superseded attempt must not touch a newer attempt of the same job.
func (w *Worker) onCancel(_ context.Context, _ bus.Address, m protocol.TaskCancel) (struct{}, error) {
	w.attempts.Cancel(m.JobID, m.AttemptID)
	return struct{}{}, nil
}

// finished reports an attempt's outcome. An attempt cut short by the worker's shutdown
// reports nothing: the worker's goodbye tells the coordinator instead.
func (w *Worker) finished(m *protocol.TaskAssign, buf *attempts.ResultBuf, o attempts.Outcome) {
	if o.StoppedBy(errShutdown) { // not errors.Is(o.Err): the task's error is not read again
		w.attemptLog(m).Debug("attempt stopped by shutdown")
		return
	}
	res := buf.Set(w.cfg.ID, m, o)
	// Cut here as the coordinator would cut it: a text longer than a NATS message
	// could not be sent at all, and would be offered again until the job's deadline.
	if res.Result != nil {
		*res.Result = protocol.ClipText(*res.Result)
	}
	if res.Error != nil {
		*res.Error = protocol.ClipText(*res.Error)
	}
	if w.debug() {
		w.attemptLog(m).Debug("attempt finished", "success", res.Success, "err", o.Text())
	}
	w.report(m, res)
}

// attemptLog is the worker's logger for one attempt. It is built only to log: every
// attempt passes here, and a logger with attributes costs allocations.
func (w *Worker) attemptLog(m *protocol.TaskAssign) *slog.Logger {
	return w.log.With("job", m.JobID, "attempt", m.AttemptID)
}

// debug reports whether debug lines are logged, so that an attempt's path does not
// build them (and box their arguments) for nothing.
func (w *Worker) debug() bool { return w.log.Enabled(context.Background(), slog.LevelDebug) }

// resultAsks is how many deliveries of results may be in flight at once: results
// that finish meanwhile wait and go together in the next (workerproto.Results).
const resultAsks = 2

// report delivers a result until the coordinator answers finally (workerproto.Results,
// which batches the results that finish while deliveries are in flight): its answer
// comes once the outcome is durable, so a result survives a coordinator restart or
// failover.
func (w *Worker) report(m *protocol.TaskAssign, res *protocol.TaskResult) {
	ack, tries, err := w.results.Deliver(res)
	switch {
	case err == nil:
		if w.debug() {
			w.attemptLog(m).Debug("result acknowledged", "accepted", ack.Accepted, "tries", tries)
		}
	case errors.Is(err, bus.ErrRemote):
		w.attemptLog(m).Warn("result refused by the coordinator", "err", err, "tries", tries)
	default:
		w.attemptLog(m).Warn("result not delivered", "err", err, "tries", tries)
	}
}
