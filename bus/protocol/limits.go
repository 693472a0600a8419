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

// Message types of the rate limit API (native extensions).
const (
	TypeSetLimit     Type = "SET_LIMIT"
	TypeRemoveLimit  Type = "REMOVE_LIMIT"
	TypeListLimits   Type = "LIST_LIMITS"
	TypeLimitList    Type = "LIMIT_LIST"
	TypeLimitRemoved Type = "LIMIT_REMOVED"
)

// LimitControlPrefix starts the key of a rate limit among the coordinator's durable
// controls: limit.type.<task type> or limit.queue.<queue>.
const LimitControlPrefix = "limit."

// LimitControlKey is the control key of the limit of scope on name.
func LimitControlKey(scope, name string) string { return LimitControlPrefix + scope + "." + name }

// SetLimit creates or replaces the rate limit of a task type or a queue. Burst is the
// most starts that may follow one another at once (the bucket's size); 0 means 1, or
// with KeepBurst the burst the limit has (1 for a new one).
type SetLimit struct {
	Scope string `json:"scope"` // LimitTaskType or LimitQueue
	Name  string `json:"name"`
	Rate  string `json:"rate"` // as ParseRate reads it: 100/s, 100/m
	Burst int64  `json:"burst,omitempty"`
	// KeepBurst (an extension) keeps the limit's burst when Burst is 0, read by the
	// coordinator as it writes: a change of the rate alone loses no burst set meanwhile.
	KeepBurst bool `json:"keepBurst,omitempty"`
}

// RemoveLimit removes a rate limit; LIMIT_REMOVED answers it.
type RemoveLimit struct {
	Scope string `json:"scope"`
	Name  string `json:"name"`
}

// ListLimits asks for every rate limit and its state; LIMIT_LIST answers it, and SET_LIMIT
// too (with the limit set).
type ListLimits struct{}

// LimitList is rate limits with their state, sorted by scope and name.
type LimitList struct {
	Limits []LimitInfo `json:"limits"`
}

// LimitRemoved answers REMOVE_LIMIT: the limit that was removed.
type LimitRemoved struct {
	Limit LimitInfo `json:"limit"`
}

// LimitInfo is a rate limit and its state on the leading coordinator.
type LimitInfo struct {
	Scope     string  `json:"scope"`
	Name      string  `json:"name"`
	Rate      string  `json:"rate"`
	Burst     int64   `json:"burst"`
	PerSecond float64 `json:"perSecond"`
	// Tokens is what the bucket holds now: starts that may follow at once.
	Tokens float64 `json:"tokens"`
	// Throttled counts the starts that had to wait for a token, since this coordinator
	// took the lead.
	Throttled uint64 `json:"throttled"`
	// NextTokenMillis is when the next token is due while the bucket is empty.
	NextTokenMillis int64 `json:"nextTokenMillis,omitempty"`
}

// LimitSpec is a rate limit as stored, the value of its control.
type LimitSpec struct {
	Rate  string `json:"rate"`
	Burst int64  `json:"burst"`
}

// Check validates a SET_LIMIT and returns its rate and effective burst.
func (m *SetLimit) Check() (Rate, int64, error) {
	if err := CheckLimitTarget(m.Scope, m.Name); err != nil {
		return Rate{}, 0, err
	}
	r, err := ParseRate(m.Rate)
	if err != nil {
		return Rate{}, 0, err
	}
	burst := m.Burst
	switch {
	case burst == 0:
		burst = 1
	case burst < 0 || burst > MaxLimitBurst:
		return Rate{}, 0, fmt.Errorf("%w: burst must be 1 to %d, got %d", ErrBadLimit, MaxLimitBurst, burst)
	}
	return r, burst, nil
}

// CheckLimitTarget reports whether scope and name can name a rate limit: scope
// LimitTaskType with a task type's name, or LimitQueue with a queue's.
func CheckLimitTarget(scope, name string) error {
	switch scope {
	case LimitTaskType:
	case LimitQueue:
		if CheckQueueName(name) != nil {
			return fmt.Errorf("%w: queue name %q must be 1 to %d characters of A-Z, a-z, 0-9, '_' or '-'", ErrBadLimit, name, MaxQueueName)
		}
		return nil
	default:
		return fmt.Errorf("%w: scope must be %q or %q, got %q", ErrBadLimit, LimitTaskType, LimitQueue, scope)
	}
	if len(name) == 0 || len(name) > MaxTaskTypeName || !taskTypeName.MatchString(name) {
		return fmt.Errorf("%w: %s name %q must be 1 to %d letters, digits, '_', '.' or '-'", ErrBadLimit, scope, name, MaxTaskTypeName)
	}
	return nil
}

// UnknownLimit is the ERROR text for removing a limit that is not set.
func UnknownLimit(scope, name string) *Error {
	return &Error{Message: fmt.Sprintf("Unknown limit: %s %s", scope, name)}
}

// BadLimit is the ERROR text for a SET_LIMIT or REMOVE_LIMIT that cannot be acted on.
func BadLimit(err error) *Error { return &Error{Message: "Invalid limit: " + err.Error()} }

func (SetLimit) MessageType() Type     { return TypeSetLimit }
func (RemoveLimit) MessageType() Type  { return TypeRemoveLimit }
func (ListLimits) MessageType() Type   { return TypeListLimits }
func (LimitList) MessageType() Type    { return TypeLimitList }
func (LimitRemoved) MessageType() Type { return TypeLimitRemoved }

func (m SetLimit) MarshalJSON() ([]byte, error) {
	type plain SetLimit
	return encode(m.MessageType(), plain(m))
}

func (m RemoveLimit) MarshalJSON() ([]byte, error) {
	type plain RemoveLimit
	return encode(m.MessageType(), plain(m))
}

func (m ListLimits) MarshalJSON() ([]byte, error) { return encode(m.MessageType(), struct{}{}) }

func (m LimitList) MarshalJSON() ([]byte, error) {
	type plain LimitList
	if m.Limits == nil {
		m.Limits = []LimitInfo{}
	}
	return encode(m.MessageType(), plain(m))
}

func (m LimitRemoved) MarshalJSON() ([]byte, error) {
	type plain LimitRemoved
	return encode(m.MessageType(), plain(m))
}
