package coordinator

import (
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TEMPORARY until the foundation lands: the record's queue and key, its aging start,
// flow control and timers.

func queueOf(j *job) string  { return protocol.DefaultQueue }
func keyOf(j *job) string    { return "" }
func agingFrom(j *job) int64 { return j.rec.CreatedAt }

func (s *scheduler) admits(queue, taskType string, now time.Time) (bool, time.Time) {
	return true, time.Time{}
}

func (s *scheduler) callAt(at time.Time, fn func(time.Time)) {}

// started counts j's start against its queue's rate and flow control.
func (s *scheduler) started(j *job, now time.Time) {
	s.ready.queue(queueOf(j)).startedAt(now)
}
