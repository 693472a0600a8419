// Package tracing is jobbus's seam to OpenTelemetry: a Tracer that is off unless a
// TracerProvider is given (and then costs a nil check per span site), the W3C trace
// context of a job as the two strings a record and a TASK_ASSIGN carry, and the
// provider that the standard OTEL_* environment variables configure (FromEnv).
//
// Span attributes follow OpenTelemetry's messaging conventions where they fit
// (messaging.system "jobbus" on the producer and consumer spans, the task type as
// messaging.destination.name, the job id as messaging.message.id); the rest are jobbus.*
// attributes. Each span carries only what its parents do not: with the SDK, an
// attribute costs about as much as a span's own bookkeeping.
package tracing

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of jobbus's spans.
const ScopeName = "github.com/jobbus/jobbus"

// Attribute keys of jobbus's spans.
const (
	AttrSystem      = attribute.Key("messaging.system")
	AttrMessageID   = attribute.Key("messaging.message.id")
	AttrDestination = attribute.Key("messaging.destination.name")
	AttrQueue       = attribute.Key("jobbus.queue")
	AttrPriority    = attribute.Key("jobbus.priority")
	AttrAttempt     = attribute.Key("jobbus.attempt")
	AttrWorker      = attribute.Key("jobbus.worker.id")
	AttrOutcome     = attribute.Key("jobbus.outcome")
	AttrState       = attribute.Key("jobbus.state")
)

// System is the messaging.system attribute every jobbus span carries.
var System = AttrSystem.String("jobbus")

// Tracer starts jobbus's spans, or nothing while off (its zero value).
type Tracer struct {
	t trace.Tracer
}

// New is the tracer of tp; a nil or no-op provider gives a tracer that is off.
func New(tp trace.TracerProvider) Tracer {
	switch tp.(type) {
	case nil, noop.TracerProvider, *noop.TracerProvider:
		return Tracer{}
	}
	return Tracer{t: tp.Tracer(ScopeName)}
}

// On reports whether spans are recorded at all: callers skip building attributes
// while it is off.
func (t Tracer) On() bool { return t.t != nil }

// Samples reports whether spans under parent are worth starting: tracing is on, and
// parent is absent (the span would root a trace, which the sampler decides) or
// sampled. jobbus's spans follow their job's sampling decision, as OpenTelemetry's
// default (parent-based) sampler does, so that a job whose trace is not sampled costs
// no span work: sampled at 10%, tracing costs about a tenth of what it costs at 100%.
func (t Tracer) Samples(parent trace.SpanContext) bool {
	return t.t != nil && (!parent.IsValid() || parent.IsSampled())
}

// Start starts a span; while off it returns ctx and a span that records nothing.
func (t Tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t.t == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.t.Start(ctx, name, opts...)
}

var w3c = propagation.TraceContext{}

// Format is the W3C traceparent and tracestate of sc ("" for an invalid one).
func Format(sc trace.SpanContext) (traceparent, tracestate string) {
	if !sc.IsValid() {
		return "", ""
	}
	var c carrier
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), &c)
	return c.parent, c.state
}

// Normal is sc's W3C trace context as Format writes it; when it was parsed from a
// version 00 traceparent without a tracestate (nearly every one), that is the very
// string it was parsed from.
func Normal(sc trace.SpanContext, traceparent, tracestate string) (string, string) {
	if sc.IsValid() && tracestate == "" && len(traceparent) == 55 && strings.HasPrefix(traceparent, "00-") {
		return traceparent, ""
	}
	return Format(sc)
}

// FromContext is the W3C trace context of the span in ctx ("" when it has none).
func FromContext(ctx context.Context) (traceparent, tracestate string) {
	return Format(trace.SpanContextFromContext(ctx))
}

// Parse reads a W3C trace context; an invalid or absent traceparent gives an invalid
// SpanContext (the tracestate alone means nothing).
func Parse(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), &carrier{parent: traceparent, state: tracestate}))
}

// Valid reports whether traceparent is a usable W3C traceparent.
func Valid(traceparent string) bool { return Parse(traceparent, "").IsValid() }

// ContextWith is ctx carrying the remote span context traceparent names as the parent
// of spans started from it; ctx itself when traceparent is empty or invalid.
func ContextWith(ctx context.Context, traceparent, tracestate string) context.Context {
	sc := Parse(traceparent, tracestate)
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// The W3C header names, lower case as the specification writes them (NATS headers are
// case-sensitive).
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// carrier is a propagation.TextMapCarrier over the two W3C headers: two strings, not
// a map, as a job's trace context is formatted or parsed a few times per job.
type carrier struct{ parent, state string }

func (c *carrier) Get(k string) string {
	switch k {
	case HeaderTraceParent:
		return c.parent
	case HeaderTraceState:
		return c.state
	}
	return ""
}

func (c *carrier) Set(k, v string) {
	switch k {
	case HeaderTraceParent:
		c.parent = v
	case HeaderTraceState:
		c.state = v
	}
}

func (c *carrier) Keys() []string { return []string{HeaderTraceParent, HeaderTraceState} }
