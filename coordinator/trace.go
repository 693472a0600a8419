package coordinator

import (
	"context"
	"time"

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
//   - "jobbus admit": from the request's arrival until the job is admitted and its
//     first write durable (JOB_SUBMITTED goes then), with the job's id;
//   - "jobbus queued": each wait in the ready queue, from the job becoming QUEUED to its
//     assignment, with its queue and priority;
//   - "jobbus result": a worker's result, from its arrival until its outcome is durable,
//     with the state it led to.
//
// Each carries only what the trace does not already say (the worker's attempt span
// has the attempt, worker and outcome; the client's, the task type): with the SDK,
// an attribute costs about as much as a span's own bookkeeping.
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

// stepTrace is the trace context that the steps of a workflow or batch submitted (or
// retried) by a request carrying from store: the request's, normalised; none without.
// The coordinator starts no span for the submission itself: each step's queued,
// attempt and result spans are children of the submitter's span.
func stepTrace(from request) [2]string {
	tp, ts := tracing.Format(tracing.Parse(from.traceParent, from.traceState))
	return [2]string{tp, ts}
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

// traceSubmission stores the trace context of j's submission and starts its admit
// span; it returns what ends that span once the first write's outcome is known (nil
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
	_, admit := s.tracer.Start(ctx, "jobbus admit", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(arrived),
		trace.WithAttributes(tracing.AttrMessageID.String(j.rec.JobID)))
	if !parent.IsValid() { // the admission roots the job's trace
		sc := admit.SpanContext()
		j.vis.trace = &sc
		j.setTraceContext(tracing.Format(sc))
	}
	if !admit.IsRecording() { // the sampler's word
		return nil
	}
	return func(err error) {
		if err != nil {
			admit.RecordError(err)
			admit.SetStatus(codes.Error, err.Error())
		}
		admit.End()
	}
}

// traceQueued records j's wait in the ready queue, from since to its assignment.
// Called with the scheduler's mu held.
func (s *scheduler) traceQueued(j *job, since time.Time) {
	if !s.tracer.On() || !j.traced() {
		return
	}
	_, span := s.tracer.Start(jobTrace(j), "jobbus queued", trace.WithTimestamp(since),
		trace.WithAttributes(tracing.AttrQueue.String(j.queueName()), tracing.AttrPriority.String(string(j.rec.Priority))))
	span.End(trace.WithTimestamp(s.now()))
}

// traceResult starts the span of a worker's result for j's current attempt; what it
// returns ends it once the outcome is durable (nil while off). Called with the
// scheduler's mu held, before the result changes j.
func (s *scheduler) traceResult(j *job) func(state protocol.State, err error) {
	if !s.tracer.On() || !j.traced() {
		return nil
	}
	_, span := s.tracer.Start(jobTrace(j), "jobbus result", trace.WithSpanKind(trace.SpanKindServer))
	if !span.IsRecording() {
		return nil
	}
	return func(state protocol.State, err error) {
		span.SetAttributes(tracing.AttrState.String(string(state)))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
