package coordinator

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/tracing"
)

// A job's trace. A submission that carries a W3C trace context (the Go client sends
// its context's; `nats req -H traceparent:...` works too) stores it in the job's
// record, and every TASK_ASSIGN hands it to the worker, whose attempt span is its
// child: so a retried job's attempts are siblings under one trace. It is stored and
// handed on whether or not this coordinator traces.
//
// With Config.TracerProvider, the coordinator adds its own spans, all children of the
// job's trace context (or, for a submission that carried none, of its admission span,
// which then roots the job's trace and is stored):
//
//   - "jobbus admit": from the request's arrival to the job's admission in memory;
//   - "jobbus store": the job's first write, until durable (JOB_SUBMITTED goes then);
//   - "jobbus queued": each wait in the ready queue, from the job becoming QUEUED to its
//     assignment, with its queue, priority and the attempt it led to;
//   - "jobbus result": a worker's result, from its arrival until its outcome is durable,
//     with the attempt, the worker and the state it led to.
//
// While tracing is off, each site costs a nil check, and a request without a
// traceparent header costs two header lookups.

// traceRequest is what a client API request's headers say of its trace.
func traceRequest(get func(string) string) (traceparent, tracestate string) {
	traceparent = get(protocol.HeaderTraceParent)
	if traceparent == "" {
		return "", ""
	}
	return traceparent, get(protocol.HeaderTraceState)
}

// jobTrace is the context of j's stored trace, for its spans' parent: parsed once
// per job and coordinator, then kept beside the record.
func jobTrace(j *job) context.Context {
	if j.vis.trace == nil {
		sc := tracing.Parse(j.traceContext())
		j.vis.trace = &sc
	}
	return trace.ContextWithRemoteSpanContext(context.Background(), *j.vis.trace)
}

// traceSubmission stores the trace context of j's submission and starts its spans;
// it returns what ends the store span once the first write's outcome is known (nil
// while tracing is off). arrived is when the request arrived (zero while off).
// Called with the scheduler's mu held.
func (s *scheduler) traceSubmission(j *job, from request, arrived time.Time) func(error) {
	parent := tracing.Parse(from.traceParent, from.traceState)
	if parent.IsValid() {
		j.setTraceContext(tracing.Format(parent)) // normalised: what a worker can parse
		j.vis.trace = &parent
	}
	if !s.tracer.On() {
		return nil
	}
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	actx, admit := s.tracer.Start(ctx, "jobbus admit", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(arrived))
	recording := admit.IsRecording() // the sampler's word, for the job's spans here
	if recording {
		admit.SetAttributes(s.jobAttrs(j, "create")...)
	}
	admit.End()
	if !parent.IsValid() { // the admission roots the job's trace
		ctx = actx
		sc := admit.SpanContext()
		j.vis.trace = &sc
		j.setTraceContext(tracing.Format(sc))
	}
	if !recording {
		return nil
	}
	_, store := s.tracer.Start(ctx, "jobbus store", trace.WithSpanKind(trace.SpanKindInternal))
	store.SetAttributes(s.jobAttrs(j, "create")...)
	return func(err error) {
		if err != nil {
			store.RecordError(err)
			store.SetStatus(codes.Error, err.Error())
		}
		store.End()
	}
}

// jobAttrs are the attributes every span of j carries, for operation op.
func (s *scheduler) jobAttrs(j *job, op string) []attribute.KeyValue {
	return []attribute.KeyValue{tracing.System, tracing.AttrOperation.String(op),
		tracing.AttrMessageID.String(j.rec.JobID), tracing.AttrTaskType.String(j.rec.TaskType),
		tracing.AttrDestination.String(j.rec.TaskType), tracing.AttrQueue.String(j.queueName()),
		tracing.AttrPriority.String(string(j.rec.Priority))}
}

// traceQueued records j's wait in the ready queue, from since to its assignment to
// worker, which starts attempt. Called with the scheduler's mu held.
func (s *scheduler) traceQueued(j *job, since time.Time, worker string) {
	if !s.tracer.On() || !j.traced() {
		return
	}
	now := s.now()
	_, span := s.tracer.Start(jobTrace(j), "jobbus queued", trace.WithTimestamp(since))
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(append(s.jobAttrs(j, "receive"), tracing.AttrAttempt.Int(j.rec.Attempts), tracing.AttrWorker.String(worker))...)
	span.End(trace.WithTimestamp(now))
}

// traceResult starts the span of a worker's result for j's current attempt; what it
// returns ends it once the outcome is durable (nil while off). Called with the
// scheduler's mu held, before the result changes j.
func (s *scheduler) traceResult(j *job, res *protocol.TaskResult) func(state protocol.State, err error) {
	if !s.tracer.On() || !j.traced() {
		return nil
	}
	outcome := "success"
	switch {
	case res.Success:
	case res.Permanent:
		outcome = "permanent_failure"
	default:
		outcome = "failure"
	}
	_, span := s.tracer.Start(jobTrace(j), "jobbus result", trace.WithSpanKind(trace.SpanKindServer))
	if !span.IsRecording() {
		return nil
	}
	span.SetAttributes(append(s.jobAttrs(j, "settle"), tracing.AttrAttempt.Int(j.rec.Attempts),
		tracing.AttrWorker.String(res.WorkerID), tracing.AttrOutcome.String(outcome))...)
	return func(state protocol.State, err error) {
		span.SetAttributes(tracing.AttrState.String(string(state)))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
