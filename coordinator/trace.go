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
	tp, ts := tracing.Normal(tracing.Parse(from.traceParent, from.traceState), from.traceParent, from.traceState)
	return [2]string{tp, ts}
}

// jobTrace is the context of j's stored trace, for its spans' parent: parsed once
// per job and coordinator, then kept beside the record.
func jobTrace(j *job) trace.SpanContext {
	if j.vis.trace == nil {
		sc := tracing.Parse(j.traceContext())
		j.vis.trace = &sc
	}
	return *j.vis.trace
}

// traceSubmission stores the trace context of j's submission; it returns what records
// its admit span once the first write's outcome is known (nil while tracing is off).
// arrived is when the request arrived (zero while off). Called with the scheduler's
// mu held; what it returns, without. The span is started here only when it roots the
// job's trace, for its context is stored with the job.
func (s *scheduler) traceSubmission(j *job, from request, arrived time.Time) func(error) {
	parent := tracing.Parse(from.traceParent, from.traceState)
	if parent.IsValid() {
		j.setTraceContext(tracing.Normal(parent, from.traceParent, from.traceState)) // what a worker can parse
		// A copy: &parent would put parent on the heap for every submission, traced or not.
		stored := parent
		j.vis.trace = &stored
	}
	if !s.tracer.Samples(parent) {
		return nil
	}
	id := tracing.AttrMessageID.String(j.rec.JobID)
	if parent.IsValid() { // the span is made once the outcome is known, without mu
		return func(err error) {
			ctx := trace.ContextWithRemoteSpanContext(context.Background(), parent)
			_, admit := s.tracer.Start(ctx, "jobbus admit", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(arrived), trace.WithAttributes(id))
			endAdmit(admit, err)
		}
	}
	// The admission roots the job's trace: its span's context is stored with the job.
	_, admit := s.tracer.Start(context.Background(), "jobbus admit", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(arrived), trace.WithAttributes(id))
	sc := admit.SpanContext()
	j.vis.trace = &sc
	j.setTraceContext(tracing.Format(sc))
	if !admit.IsRecording() { // the sampler's word
		return nil
	}
	return func(err error) { endAdmit(admit, err) }
}

// endAdmit ends an admit span once the job's first write is durable, or failed.
func endAdmit(admit trace.Span, err error) {
	if err != nil {
		admit.RecordError(err)
		admit.SetStatus(codes.Error, err.Error())
	}
	admit.End()
}

// traceQueued records j's wait in the ready queue, from since to its assignment.
// Called with the scheduler's mu held; the span is made once it is released (the
// outbox), as the SDK's work per span is several times the scheduler's per job.
func (s *scheduler) traceQueued(j *job, since time.Time) {
	if !s.tracer.On() || !j.traced() || !s.tracer.Samples(jobTrace(j)) {
		return
	}
	parent, now := jobTrace(j), s.now()
	attrs := trace.WithAttributes(tracing.AttrQueue.String(j.queueName()), tracing.AttrPriority.String(string(j.rec.Priority)))
	s.out.later(func() error {
		_, span := s.tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "jobbus queued", trace.WithTimestamp(since), attrs)
		span.End(trace.WithTimestamp(now))
		return nil
	}, nil)
}

// traceResult notes the arrival of a worker's result for j's current attempt; what it
// returns records its span once the outcome is durable (nil while off). Called with
// the scheduler's mu held, before the result changes j; what it returns, without.
func (s *scheduler) traceResult(j *job) func(state protocol.State, err error) {
	if !s.tracer.On() || !j.traced() || !s.tracer.Samples(jobTrace(j)) {
		return nil
	}
	parent, arrived := jobTrace(j), s.now()
	return func(state protocol.State, err error) {
		_, span := s.tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "jobbus result",
			trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(arrived), trace.WithAttributes(tracing.AttrState.String(string(state))))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
