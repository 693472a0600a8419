package coordinator

import "time"

// flow holds starts back where a limit says so (rate limits by task type or queue):
// dispatch asks it before it starts a job and tells it once it did. A job held back
// stays QUEUED; flow names when to look again, and dispatch arms a timer for then.
// Guarded by scheduler.mu.
type flow struct{}

// admits reports whether a job of queue and taskType may start at now; if not, next is
// when one may.
func (f *flow) admits(queue, taskType string, now time.Time) (ok bool, next time.Time) {
	return true, time.Time{}
}

// started records that a job of queue and taskType started at now.
func (f *flow) started(queue, taskType string, now time.Time) {}
