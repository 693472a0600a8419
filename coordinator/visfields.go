package coordinator

import "time"

// Until the foundation's record fields land: j's trace context and progress kept in
// memory beside the record.

func (j *job) traceContext() (traceparent, tracestate string) {
	return j.vis.traceParent, j.vis.traceState
}
func (j *job) setTraceContext(traceparent, tracestate string) {
	j.vis.traceParent, j.vis.traceState = traceparent, tracestate
}
func (j *job) traced() bool                      { return j.vis.traceParent != "" }
func (j *job) queueName() string                 { return "default" }
func (j *job) setProgress(f float64, msg string) { j.vis.progress, j.vis.message = &f, msg }
func (j *job) clearProgress()                    { j.vis.progress, j.vis.message = nil, "" }

type visFields struct {
	traceParent, traceState string
	progress                *float64
	message                 string
	queuedFrom              int64 // when a retry is queued again (Unix ms)
}

// queuedSince is when j last became QUEUED, as near as its record says.
func (j *job) queuedSince() time.Time {
	at := max(j.rec.CreatedAt, j.vis.queuedFrom)
	if j.rec.Attempts > 0 && j.vis.queuedFrom == 0 { // re-queued by a recovery
		at = j.rec.UpdatedAt
	}
	return time.UnixMilli(at)
}

// later runs fn under s.mu at (or after) at.
func (s *scheduler) later(at time.Time, fn func()) {
	time.AfterFunc(time.Until(at), func() {
		s.mu.Lock()
		defer s.unlock()
		fn()
	})
}
