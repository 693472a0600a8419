package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// ErrUnknownSchedule matches the ERROR a request about a schedule the coordinator does
// not know gets; it is a ServerError too.
var ErrUnknownSchedule = errors.New("unknown schedule")

// Schedule describes a schedule to add: a name, when (Every or Cron) and what to submit
// at each tick. It is protocol.ScheduleSpec with Go types.
type Schedule struct {
	Name string
	// Every submits a job every this long (whole milliseconds, at least a second),
	// counted from the schedule's creation.
	Every time.Duration
	// Cron submits a job at the times of a 6-field spec, seconds first
	// ("0 */5 * * * *"), or a descriptor (@hourly, @daily), read in TimeZone.
	Cron     string
	TimeZone string // an IANA name such as Europe/Berlin; "": UTC
	// CatchUp is what the schedule does with ticks that passed while no coordinator
	// ran: protocol.CatchUpNone, CatchUpOne (the default) or CatchUpAll.
	CatchUp protocol.CatchUp
	// TaskType and Payload are each tick's submission; Payload is JSON-encoded unless
	// it is already json.RawMessage. Options may set MaxAttempts and Priority; any
	// other option is refused.
	TaskType string
	Payload  any
	Options  []SubmitOption
}

// AddSchedule adds a schedule, which the leading coordinator keeps durably and ticks
// whoever leads. It is refused (a ServerError) when the name is in use, the spec is
// invalid, or the submission would be (unknown task type, bad payload).
func (c *Client) AddSchedule(ctx context.Context, s Schedule) (protocol.Schedule, error) {
	raw, ok := s.Payload.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(s.Payload); err != nil {
			return protocol.Schedule{}, fmt.Errorf("encode payload: %w", err)
		}
	}
	if s.Every%time.Millisecond != 0 {
		return protocol.Schedule{}, fmt.Errorf("every must be whole milliseconds, got %v", s.Every)
	}
	var sub protocol.SubmitJob
	for _, o := range s.Options {
		o(&sub)
	}
	if extra := unscheduled(&sub); extra != "" {
		return protocol.Schedule{}, fmt.Errorf("a schedule's options are MaxAttempts and Priority only; got %s", extra)
	}
	spec := protocol.ScheduleSpec{
		Name: s.Name, EveryMillis: s.Every.Milliseconds(), Cron: s.Cron, TimeZone: s.TimeZone, CatchUp: s.CatchUp,
		TaskType: s.TaskType, Payload: raw, MaxAttempts: sub.MaxAttempts, Priority: sub.Priority,
	}
	return c.scheduleInfo(ctx, &protocol.AddSchedule{Schedule: spec})
}

// unscheduled names the first option of sub that a schedule does not carry ("": none):
// dropped, its jobs would go elsewhere than asked (the default queue, unkeyed, now).
func unscheduled(sub *protocol.SubmitJob) string {
	switch {
	case sub.Queue != "":
		return "queue"
	case sub.ConcurrencyKey != "":
		return "concurrencyKey"
	case sub.RunAtMillis != 0:
		return "runAtMillis"
	case sub.RunInMillis != 0:
		return "runInMillis"
	case sub.UniqueForMillis != 0:
		return "uniqueForMillis"
	case sub.UniqueWhile != "":
		return "uniqueWhile"
	case len(sub.After) > 0:
		return "after"
	case sub.AfterAnyEnd:
		return "afterAnyEnd"
	case sub.IdempotencyKey != nil:
		return "idempotencyKey (each tick has its own)"
	}
	return ""
}

// Schedules lists the schedules, sorted by name, each with its next tick, its last
// run and job, and its last error.
func (c *Client) Schedules(ctx context.Context) ([]protocol.Schedule, error) {
	r, err := answer[protocol.ScheduleList](ctx, c, &protocol.ListSchedules{})
	if err != nil {
		return nil, scheduleErr(err)
	}
	return r.Schedules, nil
}

// PauseSchedule stops a schedule's ticks until ResumeSchedule; the ticks in between
// are not caught up.
func (c *Client) PauseSchedule(ctx context.Context, name string) (protocol.Schedule, error) {
	return c.scheduleInfo(ctx, &protocol.PauseSchedule{Name: name})
}

// ResumeSchedule starts a paused schedule's ticks again, from now.
func (c *Client) ResumeSchedule(ctx context.Context, name string) (protocol.Schedule, error) {
	return c.scheduleInfo(ctx, &protocol.ResumeSchedule{Name: name})
}

// RemoveSchedule removes a schedule and returns it as it was; its jobs stay.
func (c *Client) RemoveSchedule(ctx context.Context, name string) (protocol.Schedule, error) {
	return c.scheduleInfo(ctx, &protocol.RemoveSchedule{Name: name})
}

// TriggerSchedule runs a schedule once now, paused or not, and returns the job it
// submitted (once durable).
func (c *Client) TriggerSchedule(ctx context.Context, name string) (jobID string, err error) {
	s, err := c.scheduleInfo(ctx, &protocol.TriggerSchedule{Name: name})
	if err != nil {
		return "", err
	}
	return s.LastJobID, nil
}

func (c *Client) scheduleInfo(ctx context.Context, req protocol.Message) (protocol.Schedule, error) {
	r, err := answer[protocol.ScheduleInfo](ctx, c, req)
	if err != nil {
		return protocol.Schedule{}, scheduleErr(err)
	}
	return r.Schedule, nil
}

// scheduleErr is unexpected's error, matching ErrUnknownSchedule too when it says so.
func scheduleErr(err error) error {
	var se *ServerError
	if errors.As(err, &se) && strings.HasPrefix(se.Message, protocol.UnknownSchedulePrefix) {
		return &unknownScheduleError{err}
	}
	return err
}

// unknownScheduleError is the coordinator's "Unknown schedule" ERROR, matching
// ErrUnknownSchedule too. It reads as the coordinator's text alone: prefixed with the
// sentinel's, it said "unknown schedule: Unknown schedule: x".
type unknownScheduleError struct{ err error }

func (e *unknownScheduleError) Error() string   { return e.err.Error() }
func (e *unknownScheduleError) Unwrap() []error { return []error{ErrUnknownSchedule, e.err} }
