package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Rate limits (a native extension): a limit on how many jobs of one task type, or of
// one queue, start per period, enforced by the leading coordinator as a token bucket
// that holds at most Burst tokens and gains Count tokens per Period. A job over the
// limit waits QUEUED; it never fails for it.

// Bounds of a rate limit: they keep the bucket's integer arithmetic exact (a bucket
// counts in nanoseconds times Count, within int64).
const (
	MaxLimitCount  = 1_000_000
	MaxLimitBurst  = 100_000
	MinLimitPeriod = time.Millisecond
	MaxLimitPeriod = 24 * time.Hour
)

// Limit scopes: what a limit applies to.
const (
	LimitTaskType = "type"  // every job of a task type
	LimitQueue    = "queue" // every job of a queue
)

// ErrBadLimit is wrapped by every error ParseRate and LimitSpec.Check return.
var ErrBadLimit = errors.New("invalid rate limit")

// Rate is Count starts per Period.
type Rate struct {
	Count  int64
	Period time.Duration
}

// rateUnits are the unit names ParseRate reads after the slash.
var rateUnits = map[string]time.Duration{
	"ms": time.Millisecond, "s": time.Second, "sec": time.Second, "second": time.Second,
	"m": time.Minute, "min": time.Minute, "minute": time.Minute,
	"h": time.Hour, "hour": time.Hour, "d": 24 * time.Hour, "day": 24 * time.Hour,
}

// ParseRate reads a rate written COUNT/PERIOD: 100/s, 100/m, 5/h, 1000/d, or with a
// duration as the period (10/30s, 1/1m30s). COUNT is a positive integer; PERIOD is a
// unit (ms, s, m, h, d; also sec, second, min, minute, hour, day) or a Go duration,
// between 1ms and 24h.
func ParseRate(s string) (Rate, error) {
	count, unit, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rate{}, fmt.Errorf("%w: rate %q must be COUNT/PERIOD, as 100/s, 100/m or 10/30s", ErrBadLimit, s)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(count), 10, 64)
	if err != nil {
		return Rate{}, fmt.Errorf("%w: rate %q: count %q is not an integer", ErrBadLimit, s, count)
	}
	unit = strings.ToLower(strings.TrimSpace(unit))
	period, known := rateUnits[unit]
	if !known {
		if unit == "" || unit[0] < '0' || unit[0] > '9' {
			return Rate{}, fmt.Errorf("%w: rate %q: unknown unit %q (one of ms, s, m, h, d, or a duration as 30s)", ErrBadLimit, s, unit)
		}
		if period, err = time.ParseDuration(unit); err != nil {
			return Rate{}, fmt.Errorf("%w: rate %q: period %q is neither a unit (ms, s, m, h, d) nor a duration", ErrBadLimit, s, unit)
		}
	}
	r := Rate{Count: n, Period: period}
	return r, r.Check()
}

// Check reports whether r is within the bounds of a rate limit.
func (r Rate) Check() error {
	switch {
	case r.Count <= 0:
		return fmt.Errorf("%w: rate count must be positive, got %d", ErrBadLimit, r.Count)
	case r.Count > MaxLimitCount:
		return fmt.Errorf("%w: rate count must be at most %d, got %d", ErrBadLimit, MaxLimitCount, r.Count)
	case r.Period < MinLimitPeriod || r.Period > MaxLimitPeriod:
		return fmt.Errorf("%w: rate period must be between %v and %v, got %v", ErrBadLimit, MinLimitPeriod, MaxLimitPeriod, r.Period)
	}
	return nil
}

// String writes r as ParseRate reads it: a unit when the period is one, else a duration.
func (r Rate) String() string {
	switch r.Period {
	case time.Millisecond:
		return fmt.Sprintf("%d/ms", r.Count)
	case time.Second:
		return fmt.Sprintf("%d/s", r.Count)
	case time.Minute:
		return fmt.Sprintf("%d/m", r.Count)
	case time.Hour:
		return fmt.Sprintf("%d/h", r.Count)
	case 24 * time.Hour:
		return fmt.Sprintf("%d/d", r.Count)
	}
	return fmt.Sprintf("%d/%v", r.Count, r.Period)
}

// PerSecond is the rate in starts per second.
func (r Rate) PerSecond() float64 { return float64(r.Count) / r.Period.Seconds() }
