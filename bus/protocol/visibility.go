package protocol

import (
	"fmt"
	"math"
	"strings"
)

// Seeing inside a job: its W3C trace context, its progress and its log. All three are
// native extensions: a spec peer never sends nor sees them.

// Trace context headers (W3C Trace Context), as a client API request carries them: a
// SUBMIT_JOB sent with a traceparent header creates a job whose spans join that trace.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// PathProgress: worker tells TaskProgress to the coordinator. It is a tell (nothing
// waits for it): a progress report lost on the way is superseded by the next one.
const PathProgress = "task.progress"

// TaskProgress reports an attempt's latest progress. A worker sends at most a few a
// second per attempt, however often its handler reports (ProgressEvery); the
// coordinator keeps only the latest, and writes it to the job's record at most as
// often. It never changes the job's state: a report for an attempt that is not the
// job's current one is ignored.
type TaskProgress struct {
	WorkerID  string  `json:"workerId"`
	JobID     string  `json:"jobId"`
	AttemptID string  `json:"attemptId"`
	Progress  float64 `json:"progress"`
	Message   string  `json:"message,omitempty"`
}

// Worker names the worker that reports.
func (m *TaskProgress) Worker() string { return m.WorkerID }

// MaxProgressMessage bounds a progress message (longer ones are cut, on a rune boundary).
const MaxProgressMessage = 256

// Check reports whether the report is usable: ids present and a fraction in 0..1.
func (m *TaskProgress) Check() error {
	switch {
	case m.JobID == "" || m.AttemptID == "":
		return fmt.Errorf("progress without jobId or attemptId")
	case math.IsNaN(m.Progress) || m.Progress < 0 || m.Progress > 1:
		return fmt.Errorf("progress must be in [0, 1], got %v", m.Progress)
	}
	return nil
}

// ClipProgressMessage bounds a progress message to MaxProgressMessage bytes of valid UTF-8.
func ClipProgressMessage(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return runePrefix(s, MaxProgressMessage)
}

// ClampProgress brings a handler's fraction into 0..1 (NaN is 0).
func ClampProgress(f float64) float64 {
	switch {
	case math.IsNaN(f) || f < 0:
		return 0
	case f > 1:
		return 1
	}
	return f
}

// Job logs live in the JetStream stream LogsStream, one subject per job
// (LogSubject): each message a chunk of newline-separated JSON log records (slog's
// JSON form) of one attempt, at most LogChunkBytes. The stream keeps the last
// LogChunksPerJob chunks of each job (MaxMsgsPerSubject, oldest dropped first), so a
// job keeps about its last MaxLogBytesPerJob of log, whatever its handler writes; and
// as a whole it keeps at most its configured bytes (oldest jobs' logs dropped first).
// Nothing purges a job's log when the coordinator forgets the job: the stream's MaxAge
// (the retention and a margin) removes it, and until then readers ask for the job
// first, so that an expired job shows no log.
const (
	LogsStream        = "JOBBUS_LOGS"
	LogSubjectPrefix  = "jobbus.logs."
	LogChunkBytes     = 16 << 10
	LogChunksPerJob   = 64
	MaxLogBytesPerJob = LogChunkBytes * LogChunksPerJob // 1 MiB
)

// Headers of a log chunk: the attempt that wrote it, and its number among that
// attempt's chunks (from 0), so that a reader can tell that older chunks were dropped.
// HeaderLogFinal marks an attempt's last chunk, which the worker ships once the
// handler has returned (empty when it had nothing left), for an attempt that logged:
// a job cancelled, or whose deadline passed, ends before its handler returns, and a
// follower waits for this chunk to hand what the handler logged meanwhile.
const (
	HeaderLogAttempt = "Jobbus-Log-Attempt"
	HeaderLogChunk   = "Jobbus-Log-Chunk"
	HeaderLogFinal   = "Jobbus-Log-Final"
)

// LogSubject is the subject of job id's log.
func LogSubject(jobID string) string { return LogSubjectPrefix + jobID }
