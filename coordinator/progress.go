package coordinator

import (
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// ProgressWriteEvery is the least time between two writes of one job's progress to
// its record: a worker coalesces its handler's reports to one per
// worker.ProgressEvery already, and this bounds what any worker can make the
// coordinator write. The latest report is in memory at once (a status shows it); it
// reaches the record by the next write, which a due timer makes.
const ProgressWriteEvery = 250 * time.Millisecond

// progress takes a worker's progress report for the current attempt of its job, and
// nothing else: a report never changes a job's state. Called from the API.
func (s *scheduler) progress(m *protocol.TaskProgress) {
	if m.Check() != nil {
		return
	}
	s.mu.Lock()
	defer s.unlock()
	j := s.jobs[m.JobID]
	if j == nil || s.fenced != nil || j.rec.State != protocol.StateRunning || j.rec.AttemptID != m.AttemptID || j.rec.WorkerID != m.WorkerID {
		return // stale: another attempt's, or the job moved on
	}
	msg := protocol.ClipProgressMessage(m.Message)
	if p := j.rec.Progress; p != nil && *p == m.Progress && j.rec.ProgressMessage == msg {
		return // the same again (an attempt's last report is asked once more)
	}
	j.setProgress(m.Progress, msg)
	s.writeProgress(j)
}

// writeProgress writes j's progress now, or arms the timer that writes it once
// ProgressWriteEvery has passed since the last write. Called with s.mu held.
func (s *scheduler) writeProgress(j *job) {
	if j.progressDue {
		return // the armed write takes the latest
	}
	now := s.now()
	if next := j.progressAt.Add(ProgressWriteEvery); now.Before(next) {
		j.progressDue = true
		s.later(next, func() {
			j.progressDue = false
			if s.jobs[j.rec.JobID] == j && j.rec.State == protocol.StateRunning && s.fenced == nil {
				j.progressAt = s.now()
				s.markDirty(j, nil)
			}
		})
		return
	}
	j.progressAt = now
	s.markDirty(j, nil)
}
