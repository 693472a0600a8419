package coordinator

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	_ "time/tzdata" // --tz must work on a host without a zoneinfo database (a scratch image)

	"github.com/robfig/cron/v3"

	"github.com/jobbus/jobbus/bus/protocol"
)

// A schedule's time: when its ticks fall (tickSpec), and which of them to run when a
// coordinator looks at it (plan). Pure functions of the spec and the times given, so
// that tests drive them with any clock.

// tickSpec gives a schedule's ticks.
type tickSpec interface {
	// next is the first tick strictly after t; the zero time when there is none.
	next(t time.Time) time.Time
}

// everySpec ticks at anchor + k*every, k >= 1, in whole milliseconds.
type everySpec struct {
	anchor int64 // Unix milliseconds
	every  int64 // milliseconds
}

func (e everySpec) next(t time.Time) time.Time {
	ms := t.UnixMilli()
	if ms < e.anchor {
		return time.UnixMilli(e.anchor + e.every)
	}
	k := (ms-e.anchor)/e.every + 1
	return time.UnixMilli(e.anchor + k*e.every)
}

// cronSpec ticks at the times of a cron schedule, read in its zone. Across a change of
// the zone's offset it acts as cron implementations commonly do (Vixie cron, cronie):
// a wall-clock time skipped when the clocks go forward runs at the change instead of
// not at all, and one that happens twice when they go back runs once (its first
// pass), unless the schedule runs in every hour anyway: then its ticks follow real
// time through both changes, and a skipped tick runs at the change only when the
// change leaves part of its hour (a zone whose clocks move by half an hour).
//
// The fields are matched on wall time (wall: the spec read in UTC, where each wall
// time happens once), not by robfig/cron in the zone: robfig steps whole hours of real
// time, and across a change of half an hour lands on hh:30 until it wraps a day, so
// that a daily tick went missing for a day at each change.
type cronSpec struct {
	loc    *time.Location
	wall   *cron.SpecSchedule
	hourly bool // the spec runs in every hour
}

// everyHour is the bits of robfig's hour field when it matches every hour.
const everyHour = 1<<24 - 1

func newCronSpec(s *cron.SpecSchedule) cronSpec {
	wall := *s
	wall.Location = time.UTC
	return cronSpec{loc: s.Location, wall: &wall, hourly: s.Hour&everyHour == everyHour}
}

// wallAt is the wall-clock time at t in a zone off seconds east of UTC, as a UTC time.
func wallAt(t time.Time, off int) time.Time { return t.UTC().Add(time.Duration(off) * time.Second) }

// next walks the spans of real time that have one offset each (ZoneBounds): within
// one, wall time moves with real time, and the span's ticks are its wall times that
// match, but for those the span before already passed (the clocks went back); between
// two, the wall times the clocks skipped (skippedRuns).
func (c cronSpec) next(t time.Time) time.Time {
	start, end := t.In(c.loc).ZoneBounds()
	_, off := t.In(c.loc).Zone()
	prev := off
	if !start.IsZero() {
		_, prev = start.Add(-time.Nanosecond).In(c.loc).Zone()
	}
	from := wallAt(t, off)
	for {
		repeated := wallAt(start, prev) // the wall times before it were passed before start
		for {
			w := c.wall.Next(from)
			if w.IsZero() {
				return w
			}
			if !end.IsZero() && !w.Before(wallAt(end, off)) {
				break // past the span
			}
			if c.hourly || prev <= off || !w.Before(repeated) {
				return w.Add(-time.Duration(off) * time.Second).In(t.Location())
			}
			from = repeated.Add(-time.Nanosecond) // its first pass was before start
		}
		_, after := end.In(c.loc).Zone()
		if after > off && c.skippedRuns(wallAt(end, off), wallAt(end, after)) {
			return end.In(t.Location())
		}
		start, prev, off = end, off, after
		_, end = start.In(c.loc).ZoneBounds()
		from = wallAt(start, off).Add(-time.Nanosecond)
	}
}

// skippedRuns reports whether a tick falls in the wall times [from, to) that the clocks
// skip going forward: it runs at the change. For a schedule that runs in every hour,
// only a tick in the hour the clocks go to counts: an hour skipped whole leaves real
// time no hour without a tick.
func (c cronSpec) skippedRuns(from, to time.Time) bool {
	if h := to.Truncate(time.Hour); c.hourly && h.After(from) {
		from = h
	}
	w := c.wall.Next(from.Add(-time.Nanosecond))
	return !w.IsZero() && w.Before(to)
}

// cronParser reads 6-field specs (seconds first) and descriptors (@daily; its @every 1h
// parses too, and parseSpec refuses it).
var cronParser = cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// errInvalidSchedule marks a spec refused as asked.
var errInvalidSchedule = errors.New("invalid schedule")

// parseSpec checks spec and returns its ticks, for a schedule created at created
// (Unix milliseconds): the anchor of an every schedule.
func parseSpec(spec *protocol.ScheduleSpec, created int64) (tickSpec, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errInvalidSchedule, fmt.Sprintf(format, args...))
	}
	if err := protocol.CheckScheduleName(spec.Name); err != nil {
		return nil, bad("%v", err)
	}
	if _, err := protocol.ParseCatchUp(string(spec.CatchUp)); err != nil {
		return nil, bad("%v", err)
	}
	switch {
	case spec.EveryMillis != 0 && spec.Cron != "":
		return nil, bad("give either every or cron, not both")
	case spec.EveryMillis != 0:
		if spec.EveryMillis < protocol.MinScheduleEveryMillis {
			return nil, bad("every must be at least %v, got %s", time.Duration(protocol.MinScheduleEveryMillis)*time.Millisecond,
				everyText(spec.EveryMillis))
		}
		if spec.EveryMillis > protocol.MaxScheduleEveryMillis {
			return nil, bad("every must be at most %d days, got %s", protocol.MaxScheduleEveryMillis/86_400_000, everyText(spec.EveryMillis))
		}
		if spec.TimeZone != "" {
			return nil, bad("a time zone applies to cron schedules only")
		}
		return everySpec{anchor: created, every: spec.EveryMillis}, nil
	case spec.Cron != "":
		loc := time.UTC
		if spec.TimeZone != "" {
			l, err := time.LoadLocation(spec.TimeZone)
			if err != nil || spec.TimeZone == "Local" {
				return nil, bad("unknown time zone %q (an IANA name such as Europe/Berlin)", spec.TimeZone)
			}
			loc = l
		}
		if strings.HasPrefix(spec.Cron, "TZ=") || strings.HasPrefix(spec.Cron, "CRON_TZ=") {
			return nil, bad("cron %q: give the time zone as the schedule's time zone (--tz), not in the spec", spec.Cron)
		}
		s, err := cronParser.Parse("CRON_TZ=" + loc.String() + " " + spec.Cron)
		if err != nil {
			return nil, bad("cron %q: %v (6 fields: second minute hour day-of-month month day-of-week, or @hourly, @daily, @weekly, @monthly, @yearly; a period is every, not a cron spec)", spec.Cron, err)
		}
		ss, ok := s.(*cron.SpecSchedule)
		if !ok {
			// robfig's @every counts from whatever time it is given; a schedule's ticks
			// must be the same for every coordinator: anchored as --every is.
			return nil, bad("cron %q: use every instead of @every", spec.Cron)
		}
		cs := newCronSpec(ss)
		if cs.next(time.UnixMilli(created)).IsZero() {
			return nil, bad("cron %q never fires", spec.Cron)
		}
		return cs, nil
	}
	return nil, bad("give every or cron")
}

// everyText writes a period asked for as a duration when it is one, else in
// milliseconds: time.Duration wraps around beyond about 292 years.
func everyText(ms int64) string {
	if limit := int64(math.MaxInt64 / time.Millisecond); ms > limit || ms < -limit {
		return fmt.Sprintf("%dms", ms)
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// maxPlanTicks bounds the ticks one plan runs: catch-up all of a long downtime runs in
// rounds, each a plan of its own once the last is done. It also bounds the due ticks
// plan steps through one by one for the other policies, which then look for the
// latest due tick backwards from now.
const maxPlanTicks = 1000

// tickPlan is what to do about a schedule at some time: the ticks to run now, in
// order, how many due ones are skipped (at least; counted up to maxPlanTicks), and
// the tick to wait for next (zero: none).
type tickPlan struct {
	run     []time.Time
	skipped int
	next    time.Time
}

// planTicks decides, at now, about the ticks of sp after done (the last tick done, or when
// ticks started counting). recovering says that no coordinator watched the schedule
// until now (a restart, a takeover): then catch-up decides about the due ticks, which
// passed while none ran. Otherwise a timer fired for the first of them, and catch-up
// only decides about the ones after it that this coordinator fell behind on: none and
// one run the latest due tick (the one on time, or nearest to it), all runs each.
func planTicks(sp tickSpec, done, now time.Time, catchUp protocol.CatchUp, recovering bool) tickPlan {
	var p tickPlan
	var due []time.Time
	t := sp.next(done)
	for !t.IsZero() && !t.After(now) {
		if len(due) == maxPlanTicks {
			if catchUp == protocol.CatchUpAll {
				p.run, p.next = due, t // t is due already: its plan follows at once
				return p
			}
			due = []time.Time{latestDue(sp, done, now)}
			p.skipped = maxPlanTicks
			t = sp.next(due[0])
			break
		}
		due = append(due, t)
		t = sp.next(t)
	}
	p.next = t
	switch {
	case len(due) == 0:
	case catchUp == protocol.CatchUpAll:
		p.run = due
	case catchUp == protocol.CatchUpNone && recovering:
		p.skipped += len(due)
	default:
		p.run = due[len(due)-1:]
		p.skipped += len(due) - 1
	}
	return p
}

// latestDue is the last tick of sp in (done, now], of which there is at least one: it
// looks back from now over a window that doubles until it holds a tick, so a long
// downtime costs a few dozen steps, not one per tick missed.
func latestDue(sp tickSpec, done, now time.Time) time.Time {
	for d := time.Second; ; d *= 2 {
		from := now.Add(-d)
		if !from.After(done) {
			from = done
		}
		t := sp.next(from)
		if !t.IsZero() && !t.After(now) {
			for u := sp.next(t); !u.IsZero() && !u.After(now); u = sp.next(u) {
				t = u
			}
			return t
		}
		if from.Equal(done) {
			return time.Time{} // none after all: the caller's precondition failed
		}
	}
}
