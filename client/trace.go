package client

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jobbus/jobbus/internal/tracing"
)

// WithTracerProvider has the client trace each submission with a "jobbus submit" span
// (kind producer) from tp, e.g. otel.GetTracerProvider(). Tracing is off by default.
//
// Whether or not the client traces, a submission whose context carries a span sends
// its W3C trace context (a traceparent header on NATS): the job stores it, its
// coordinator's and workers' spans join that trace, and a native handler's context
// carries it. The TCP transport sends none (the spec's client port has no headers).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *Client) { c.tracer = tracing.New(tp) }
}

// submitSpan starts the span of a submission of taskType; end ends it, with the error
// if it failed. The job's id is on the coordinator's admit span, its child.
func (c *Client) submitSpan(ctx context.Context, taskType string, attrs ...attribute.KeyValue) (context.Context, func(string, error)) {
	if !c.tracer.Samples(trace.SpanContextFromContext(ctx)) { // off, or an unsampled trace
		return ctx, func(string, error) {}
	}
	ctx, span := c.tracer.Start(ctx, "jobbus submit", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(tracing.System, tracing.AttrDestination.String(taskType)), trace.WithAttributes(attrs...))
	return ctx, func(_ string, err error) {
		if err != nil && span.IsRecording() {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// traceHeader is the NATS header carrying ctx's trace context, or nil without one.
func traceHeader(ctx context.Context) nats.Header {
	tp, ts := tracing.FromContext(ctx)
	if tp == "" {
		return nil
	}
	h := nats.Header{tracing.HeaderTraceParent: {tp}}
	if ts != "" {
		h[tracing.HeaderTraceState] = []string{ts}
	}
	return h
}
