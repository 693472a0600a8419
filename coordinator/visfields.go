package coordinator

import (
	"time"

	"go.opentelemetry.io/otel/trace"
)

// A job's trace context and progress live in its record (TraceParent, TraceState,
// Progress, ProgressMessage); what the coordinator keeps beside them is here.

func (j *job) traceContext() (traceparent, tracestate string) {
	return j.rec.TraceParent, j.rec.TraceState
}

func (j *job) setTraceContext(traceparent, tracestate string) {
	j.rec.TraceParent, j.rec.TraceState = traceparent, tracestate
}

func (j *job) traced() bool { return j.rec.TraceParent != "" }

// queueName is j's queue as its spans name it.
func (j *job) queueName() string {
	if j.rec.Queue == "" {
		return "default"
	}
	return j.rec.Queue
}

func (j *job) setProgress(f float64, msg string) { j.rec.Progress, j.rec.ProgressMessage = &f, msg }
func (j *job) clearProgress()                    { j.rec.Progress, j.rec.ProgressMessage = nil, "" }

// visFields is what the coordinator keeps of a job for its spans, in memory only.
type visFields struct {
	queuedFrom int64              // when a retry is queued again (Unix ms)
	trace      *trace.SpanContext // its record's trace context, parsed once traced (trace.go)
}

// queuedSince is when j last became QUEUED, as near as its record says: for a retry
// its retry time, else when it became due (Record.AgingFrom); for a job a recovery
// queued again, its last update.
func (j *job) queuedSince() time.Time {
	at := max(j.rec.AgingFrom(), j.vis.queuedFrom)
	if j.rec.Attempts > 0 && j.vis.queuedFrom == 0 {
		at = j.rec.UpdatedAt
	}
	return time.UnixMilli(at)
}

// later runs fn under s.mu once at comes, on the scheduler's one timer (timers.go).
// Called with s.mu held.
func (s *scheduler) later(at time.Time, fn func()) {
	s.timers.call(at, func(time.Time) { fn() })
}
