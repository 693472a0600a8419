package tasks

import (
	"errors"
	"fmt"
	"time"
)

// ErrSnooze matches (errors.Is) the error Snooze returns.
var ErrSnooze = errors.New("snooze")

// Snooze is what a task returns to run its job again after d instead of now, without
// using an attempt (River's JobSnooze): the job goes back to SCHEDULED for d, with its
// attempts unchanged and its snooze count one higher. d is at least a millisecond.
func Snooze(d time.Duration) error { return &SnoozeError{Delay: max(d, time.Millisecond)} }

// SnoozeError is a snooze's error value; Delay is how long the job waits.
type SnoozeError struct{ Delay time.Duration }

func (e *SnoozeError) Error() string        { return fmt.Sprintf("snoozed for %v", e.Delay) }
func (e *SnoozeError) Is(target error) bool { return target == ErrSnooze }

// SnoozeOf is the delay of a snooze wrapped in err, and whether err is one.
func SnoozeOf(err error) (time.Duration, bool) {
	var s *SnoozeError
	if errors.As(err, &s) {
		return s.Delay, true
	}
	return 0, false
}
