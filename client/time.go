package client

import (
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// RunAt makes the job wait in SCHEDULED until t (to the millisecond), then queue like
// any job, with its priority (aging counts from t). A time not after the coordinator's
// now queues it at once.
func RunAt(t time.Time) SubmitOption {
	return func(s *protocol.SubmitJob) { s.RunAtMillis, s.RunInMillis = t.UnixMilli(), 0 }
}

// RunIn makes the job wait in SCHEDULED for d from when the coordinator accepts it (its
// clock decides, so a client's clock skew does not matter), then queue like any job.
// d <= 0 queues it at once.
func RunIn(d time.Duration) SubmitOption {
	return func(s *protocol.SubmitJob) { s.RunInMillis, s.RunAtMillis = max(d.Milliseconds(), 0), 0 }
}
