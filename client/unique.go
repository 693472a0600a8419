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
// of the same task type and payload that asks for uniqueness is answered with this
// job's id, unless this job failed or was cancelled. A job that completed within d
// still holds it. d is rounded down to milliseconds, a positive d to 1 ms at least; 0
// asks for nothing, and a negative d is refused by the coordinator.
func UniqueFor(d time.Duration) SubmitOption {
	ms := d.Milliseconds()
	if d > 0 && ms == 0 {
		ms = 1
	}
	return func(s *protocol.SubmitJob) { s.UniqueForMillis = ms }
}

// UniqueWhileActive makes the job unique while it is active (not yet COMPLETED, FAILED
// or CANCELLED): until then, a submission of the same task type and payload that asks
// for uniqueness is answered with this job's id.
func UniqueWhileActive() SubmitOption {
	return func(s *protocol.SubmitJob) { s.UniqueWhile = protocol.UniqueWhileActive }
}
