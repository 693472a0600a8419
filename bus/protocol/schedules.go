package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Schedules (a native extension; spec peers never see them): named, durable, periodic
// submissions. The leading coordinator keeps each schedule as a durable setting (in
// JobsBucket under ControlPrefix + SchedulePrefix + name, the Schedule's JSON) and
// submits one job per tick, through its normal submit path, under the idempotency key
// ScheduleTickKey(name, tick): a failover or a restart in the middle of a tick finds
// the job the last one stored instead of submitting another.

// SchedulePrefix starts a schedule's setting key after ControlPrefix: "schedule.<name>".
const SchedulePrefix = "schedule."

// MaxScheduleName bounds a schedule's name.
const MaxScheduleName = 128

var scheduleName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// ErrBadScheduleName is returned (wrapped) by CheckScheduleName.
var ErrBadScheduleName = errors.New("bad schedule name")

// CheckScheduleName reports whether name can name a schedule: 1 to MaxScheduleName
// characters of A-Z, a-z, 0-9, '_' and '-' (it is one token of a KV key).
func CheckScheduleName(name string) error {
	if len(name) == 0 || len(name) > MaxScheduleName || !scheduleName.MatchString(name) {
		return fmt.Errorf("%w %q: 1 to %d characters of A-Z, a-z, 0-9, '_', '-'", ErrBadScheduleName, name, MaxScheduleName)
	}
	return nil
}

// ScheduleTickKey is the idempotency key of the job a schedule's tick submits.
func ScheduleTickKey(name string, tickMillis int64) string {
	return fmt.Sprintf("schedule:%s:%d", name, tickMillis)
}

// ScheduleTriggerKey is the idempotency key of the job a trigger of schedule name
// submits: run, unique to the trigger, so that each trigger is a run of its own and
// none shares a tick's key (a name has no ':').
func ScheduleTriggerKey(name, run string) string {
	return fmt.Sprintf("schedule:%s:trigger:%s", name, run)
}

// CatchUp says what a schedule does with the ticks that passed while no coordinator
// ran (or while the leader could not submit): none skips them, one runs the latest of
// them once, all runs each of them.
type CatchUp string

// The catch-up policies; "" means CatchUpOne.
const (
	CatchUpNone CatchUp = "none"
	CatchUpOne  CatchUp = "one"
	CatchUpAll  CatchUp = "all"
)

// ParseCatchUp reads a catch-up policy, case-insensitively; "" is CatchUpOne.
func ParseCatchUp(s string) (CatchUp, error) {
	switch c := CatchUp(strings.ToLower(s)); c {
	case "":
		return CatchUpOne, nil
	case CatchUpNone, CatchUpOne, CatchUpAll:
		return c, nil
	}
	return "", fmt.Errorf("catch-up must be none, one or all, got %q", s)
}

// ScheduleSpec is what a schedule is asked to do: when (every EveryMillis, or at the
// times of Cron, a 6-field spec with seconds read in TimeZone) and what (the
// submission of each tick).
type ScheduleSpec struct {
	Name string `json:"name"`
	// EveryMillis: a tick every this many milliseconds, counted from the schedule's
	// creation (at least MinScheduleEveryMillis, at most MaxScheduleEveryMillis).
	EveryMillis int64 `json:"everyMillis,omitempty"`
	// Cron: "second minute hour day-of-month month day-of-week", or a descriptor
	// (@hourly, @daily, @weekly, @monthly, @yearly; not @every: EveryMillis is the period).
	Cron string `json:"cron,omitempty"`
	// TimeZone (an IANA name, such as Europe/Berlin) in which Cron is read; "" is UTC.
	TimeZone string  `json:"timeZone,omitempty"`
	CatchUp  CatchUp `json:"catchUp,omitempty"`
	// The submission of each tick.
	TaskType    string          `json:"taskType"`
	Payload     json.RawMessage `json:"payload,omitempty"` // left out of a list too large for one reply
	MaxAttempts int             `json:"maxAttempts,omitempty"`
	Priority    *Priority       `json:"priority,omitempty"`
}

// MinScheduleEveryMillis is the shortest period of an every schedule.
const MinScheduleEveryMillis = 1000

// MaxScheduleEveryMillis is the longest period of an every schedule: as far ahead as a
// job may be scheduled (MaxRunAhead). Beyond it a period is more likely a unit mistake
// than a plan, and one near the int64 range would wrap around in the tick arithmetic.
const MaxScheduleEveryMillis = int64(MaxRunAhead / time.Millisecond)

// Schedule is a schedule as stored (the control's value) and listed: its spec and
// what became of its ticks.
type Schedule struct {
	ScheduleSpec
	Paused          bool  `json:"paused"`
	CreatedAtMillis int64 `json:"createdAtMillis"`
	// SinceMillis: ticks after it are due (its creation, or its last resume).
	SinceMillis int64 `json:"sinceMillis"`
	// LastTickMillis is the latest tick done: its job submitted, or given up.
	LastTickMillis int64 `json:"lastTickMillis,omitempty"`
	// LastJobID is the job of the latest tick that submitted one (or of a trigger),
	// submitted at LastRunMillis.
	LastJobID     string `json:"lastJobId,omitempty"`
	LastRunMillis int64  `json:"lastRunMillis,omitempty"`
	// LastError is why the latest tick failed (its submission was refused), until one
	// succeeds; Failures counts the ticks that failed in a row.
	LastError       string `json:"lastError,omitempty"`
	LastErrorMillis int64  `json:"lastErrorMillis,omitempty"`
	Failures        int    `json:"failures,omitempty"`
	// NextTickMillis is when the next tick is due (listing only; 0 while paused, or
	// when the spec has no further tick).
	NextTickMillis int64 `json:"nextTickMillis,omitempty"`
}

// AddSchedule asks for a new schedule.
type AddSchedule struct {
	Schedule ScheduleSpec `json:"schedule"`
}

// ListSchedules asks for every schedule, sorted by name.
type ListSchedules struct{}

// PauseSchedule, ResumeSchedule, RemoveSchedule and TriggerSchedule name a schedule.
type (
	PauseSchedule struct {
		Name string `json:"name"`
	}
	ResumeSchedule struct {
		Name string `json:"name"`
	}
	RemoveSchedule struct {
		Name string `json:"name"`
	}
	TriggerSchedule struct {
		Name string `json:"name"`
	}
)

// ScheduleInfo answers AddSchedule, PauseSchedule, ResumeSchedule and RemoveSchedule
// with the schedule as it now is (as it was, for a removal), and TriggerSchedule with
// the schedule after its run (LastJobID is the triggered job).
type ScheduleInfo struct {
	Schedule Schedule `json:"schedule"`
}

// ScheduleList answers ListSchedules.
type ScheduleList struct {
	Schedules []Schedule `json:"schedules"`
}

// UnknownSchedule is the ERROR text for a schedule name the coordinator does not know.
func UnknownSchedule(name string) *Error {
	return &Error{Message: "Unknown schedule: " + name}
}

// UnknownSchedulePrefix starts UnknownSchedule's text.
const UnknownSchedulePrefix = "Unknown schedule: "

// ScheduleExists is the ERROR text for adding a schedule under a name in use.
func ScheduleExists(name string) *Error {
	return &Error{Message: fmt.Sprintf("Schedule '%s' already exists (remove it first)", name)}
}

// InvalidSchedule is the ERROR text for a schedule refused as asked.
func InvalidSchedule(detail string) *Error {
	return &Error{Message: "Invalid schedule: " + detail}
}

func (AddSchedule) MessageType() Type     { return TypeAddSchedule }
func (ListSchedules) MessageType() Type   { return TypeListSchedules }
func (PauseSchedule) MessageType() Type   { return TypePauseSchedule }
func (ResumeSchedule) MessageType() Type  { return TypeResumeSchedule }
func (RemoveSchedule) MessageType() Type  { return TypeRemoveSchedule }
func (TriggerSchedule) MessageType() Type { return TypeTriggerSchedule }
func (ScheduleInfo) MessageType() Type    { return TypeScheduleInfo }
func (ScheduleList) MessageType() Type    { return TypeScheduleList }

func (m AddSchedule) MarshalJSON() ([]byte, error) {
	type plain AddSchedule
	if m.Schedule.Payload == nil {
		m.Schedule.Payload = json.RawMessage("null")
	}
	return encode(m.MessageType(), plain(m))
}

func (m ListSchedules) MarshalJSON() ([]byte, error) { return encode(m.MessageType(), struct{}{}) }

func (m PauseSchedule) MarshalJSON() ([]byte, error) {
	type plain PauseSchedule
	return encode(m.MessageType(), plain(m))
}

func (m ResumeSchedule) MarshalJSON() ([]byte, error) {
	type plain ResumeSchedule
	return encode(m.MessageType(), plain(m))
}

func (m RemoveSchedule) MarshalJSON() ([]byte, error) {
	type plain RemoveSchedule
	return encode(m.MessageType(), plain(m))
}

func (m TriggerSchedule) MarshalJSON() ([]byte, error) {
	type plain TriggerSchedule
	return encode(m.MessageType(), plain(m))
}

func (m ScheduleInfo) MarshalJSON() ([]byte, error) {
	type plain ScheduleInfo
	return encode(m.MessageType(), plain(m))
}

func (m ScheduleList) MarshalJSON() ([]byte, error) {
	type plain ScheduleList
	if m.Schedules == nil {
		m.Schedules = []Schedule{}
	}
	return encode(m.MessageType(), plain(m))
}
