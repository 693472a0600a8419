package client

import (
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Unique jobs (a jobbus extension). Where an idempotency key names one request, and a
// repeat of it is the same request, uniqueness names the work: the task type and the
// payload (compared as canonical JSON). A submission whose work is held by another job
// is answered with that job's id and creates nothing.

// UniqueFor makes the job unique for d after its submission: until then, a submission
// of the same task type and payload is answered with this job's id, unless this job
// failed or was cancelled. A job that completed within d still holds it. d is rounded
// down to milliseconds (at least 1 ms).
func UniqueFor(d time.Duration) SubmitOption {
	return func(s *protocol.SubmitJob) { s.UniqueForMillis = max(d.Milliseconds(), 1) }
}

// UniqueWhileActive makes the job unique while it is active (not yet COMPLETED, FAILED
// or CANCELLED): until then, a submission of the same task type and payload is answered
// with this job's id.
func UniqueWhileActive() SubmitOption {
	return func(s *protocol.SubmitJob) { s.UniqueWhile = protocol.UniqueWhileActive }
}
