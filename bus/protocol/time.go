package protocol

import (
	"fmt"
	"time"
)

// Delayed jobs on the wire (extensions): SUBMIT_JOB's runAtMillis (Unix milliseconds)
// or runInMillis (from the coordinator's now) make a job SCHEDULED until then; a
// record of a SCHEDULED job carries its due time in HeaderRunAt too, so that recovery
// need not read a far-future job whole.

// HeaderRunAt is a SCHEDULED record's due time, Unix milliseconds.
const HeaderRunAt = "Jobbus-Run-At"

// MaxRunAhead is how far ahead a job may be scheduled: beyond it a run time is more
// likely a unit mistake (microseconds for milliseconds) than a plan.
const MaxRunAhead = 10 * 366 * 24 * time.Hour

// earliestRunAt is 2000-01-01T00:00:00Z: a runAtMillis before it is taken for a
// mistake (seconds for milliseconds) rather than a time long past.
const earliestRunAt = 946_684_800_000

// InvalidRunTime is the ERROR text for a run time refused.
func InvalidRunTime(detail string) *Error {
	return &Error{Message: "Invalid run time: " + detail}
}

// CheckRunTime returns the due time (Unix milliseconds) that runAtMillis or
// runInMillis (0: not given) ask for at nowMillis, or the ERROR that refuses them.
func CheckRunTime(atMillis, inMillis, nowMillis int64) (int64, *Error) {
	ahead := MaxRunAhead.Milliseconds()
	switch {
	case atMillis != 0 && inMillis != 0:
		return 0, InvalidRunTime("give runAtMillis or runInMillis, not both")
	case inMillis < 0:
		return 0, InvalidRunTime(fmt.Sprintf("runInMillis must be at least 0, got %d", inMillis))
	case inMillis > ahead:
		return 0, InvalidRunTime(fmt.Sprintf("runInMillis %d is more than %d days ahead", inMillis, ahead/86_400_000))
	case inMillis > 0:
		return nowMillis + inMillis, nil
	case atMillis < earliestRunAt:
		return 0, InvalidRunTime(fmt.Sprintf("runAtMillis %d is before 2000-01-01: it counts milliseconds since the Unix epoch (seconds given?)", atMillis))
	case atMillis-nowMillis > ahead:
		return 0, InvalidRunTime(fmt.Sprintf("runAtMillis %d (%s) is more than %d days ahead (microseconds given?)",
			atMillis, time.UnixMilli(atMillis).UTC().Format(time.RFC3339), ahead/86_400_000))
	}
	return atMillis, nil
}

// ScheduledAtCapacity is the rejection of a SCHEDULED submission beyond the bound on
// SCHEDULED jobs, which is apart from the active jobs' (ActiveCount counts SCHEDULED
// jobs here).
func ScheduledAtCapacity(scheduled, limit int) *SubmitRejected {
	return &SubmitRejected{
		Reason:      fmt.Sprintf("coordinator at capacity: %d scheduled jobs (limit %d)", scheduled, limit),
		ActiveCount: scheduled,
		Limit:       limit,
		Retryable:   true,
	}
}
