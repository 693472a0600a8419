package coordinator

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

// ticks lists the first n ticks of sp after from, in UTC.
func ticks(sp tickSpec, from time.Time, n int) []string {
	var out []string
	for t := from; len(out) < n; {
		t = sp.next(t)
		if t.IsZero() {
			break
		}
		out = append(out, t.UTC().Format(time.RFC3339Nano))
	}
	return out
}

func mustSpec(t *testing.T, spec protocol.ScheduleSpec, created time.Time) tickSpec {
	t.Helper()
	if spec.Name == "" {
		spec.Name = "s"
	}
	sp, err := parseSpec(&spec, created.UnixMilli())
	if err != nil {
		t.Fatalf("parseSpec(%+v): %v", spec, err)
	}
	return sp
}

// TestScheduleTicks: every counts whole periods from the schedule's creation; cron reads
// its six fields (seconds first) in its time zone, and across a DST change keeps wall
// time: a time the spring change skips runs at the change, a time the autumn change
// repeats runs once, and a schedule that runs every hour follows real time through both.
func TestScheduleTicks(t *testing.T) {
	t.Parallel()
	created := utc("2026-03-28T10:00:00.250Z")
	cases := []struct {
		name string
		spec protocol.ScheduleSpec
		from string
		want []string
	}{
		{"EveryFromCreation", protocol.ScheduleSpec{EveryMillis: 30000}, "2026-03-28T10:00:00.250Z",
			[]string{"2026-03-28T10:00:30.25Z", "2026-03-28T10:01:00.25Z", "2026-03-28T10:01:30.25Z"}},
		{"EveryFromAnyTime", protocol.ScheduleSpec{EveryMillis: 30000}, "2026-03-28T11:00:29Z",
			[]string{"2026-03-28T11:00:30.25Z", "2026-03-28T11:01:00.25Z"}},
		{"EveryBeforeCreation", protocol.ScheduleSpec{EveryMillis: 1000}, "2020-01-01T00:00:00Z",
			[]string{"2026-03-28T10:00:01.25Z", "2026-03-28T10:00:02.25Z"}},
		{"CronSeconds", protocol.ScheduleSpec{Cron: "*/15 * * * * *"}, "2026-03-28T10:00:00.250Z",
			[]string{"2026-03-28T10:00:15Z", "2026-03-28T10:00:30Z", "2026-03-28T10:00:45Z", "2026-03-28T10:01:00Z"}},
		{"CronEveryFiveMinutes", protocol.ScheduleSpec{Cron: "0 */5 * * * *"}, "2026-03-28T10:00:00Z",
			[]string{"2026-03-28T10:05:00Z", "2026-03-28T10:10:00Z"}},
		{"CronDescriptor", protocol.ScheduleSpec{Cron: "@hourly"}, "2026-03-28T10:00:00Z",
			[]string{"2026-03-28T11:00:00Z", "2026-03-28T12:00:00Z"}},
		// Berlin: CET (UTC+1) until 2026-03-29 01:00 UTC, then CEST (UTC+2); back to CET
		// at 2026-10-25 01:00 UTC.
		{"BerlinDailyAcrossSpring", protocol.ScheduleSpec{Cron: "0 0 9 * * *", TimeZone: "Europe/Berlin"}, "2026-03-28T00:00:00Z",
			[]string{"2026-03-28T08:00:00Z", "2026-03-29T07:00:00Z", "2026-03-30T07:00:00Z"}},
		{"BerlinSkippedTimeRunsAtTheChange", protocol.ScheduleSpec{Cron: "0 30 2 * * *", TimeZone: "Europe/Berlin"}, "2026-03-28T00:00:00Z",
			[]string{"2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"}},
		{"BerlinRepeatedTimeRunsOnce", protocol.ScheduleSpec{Cron: "0 30 2 * * *", TimeZone: "Europe/Berlin"}, "2026-10-24T00:00:00Z",
			[]string{"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		{"BerlinHourlyFollowsRealTimeInAutumn", protocol.ScheduleSpec{Cron: "0 30 * * * *", TimeZone: "Europe/Berlin"}, "2026-10-24T23:00:00Z",
			[]string{"2026-10-24T23:30:00Z", "2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", "2026-10-25T02:30:00Z"}},
		{"BerlinHourlyFollowsRealTimeInSpring", protocol.ScheduleSpec{Cron: "0 30 * * * *", TimeZone: "Europe/Berlin"}, "2026-03-28T23:00:00Z",
			[]string{"2026-03-28T23:30:00Z", "2026-03-29T00:30:00Z", "2026-03-29T01:30:00Z"}},
		{"BerlinSkippedHourRunsOnceAtTheChange", protocol.ScheduleSpec{Cron: "0 */15 2 * * *", TimeZone: "Europe/Berlin"}, "2026-03-28T01:50:00Z",
			[]string{"2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z", "2026-03-30T00:15:00Z"}},
		{"BerlinRepeatedHourRunsItsFirstPass", protocol.ScheduleSpec{Cron: "0 */15 2 * * *", TimeZone: "Europe/Berlin"}, "2026-10-24T23:59:00Z",
			[]string{"2026-10-25T00:00:00Z", "2026-10-25T00:15:00Z", "2026-10-25T00:30:00Z", "2026-10-25T00:45:00Z", "2026-10-26T01:00:00Z"}},
		// Yearly on the night of a spring change: 02:30 on 30 March exists in 2024 (the
		// change was on the 31st), not in 2025 (it was on the 30th): it runs at that
		// change, not a year later.
		{"BerlinSkippedTimeOnAYearlyDate", protocol.ScheduleSpec{Cron: "0 30 2 30 3 *", TimeZone: "Europe/Berlin"}, "2024-03-30T01:30:00Z",
			[]string{"2025-03-30T01:00:00Z", "2026-03-30T00:30:00Z"}},
		// Lord Howe: +10:30 until 2026-10-03 15:30 UTC (02:00 local), then +11; back at
		// 2026-04-04 15:00 UTC. The hour 02 keeps 02:30-02:59 in spring: its tick runs at
		// the change; a daily tick after the change runs that day.
		{"LordHoweHourlyRunsThePartHour", protocol.ScheduleSpec{Cron: "0 0 * * * *", TimeZone: "Australia/Lord_Howe"}, "2026-10-03T14:00:00Z",
			[]string{"2026-10-03T14:30:00Z", "2026-10-03T15:30:00Z", "2026-10-03T16:00:00Z"}},
		{"LordHoweHourlyAcrossAutumn", protocol.ScheduleSpec{Cron: "0 45 * * * *", TimeZone: "Australia/Lord_Howe"}, "2026-04-04T14:00:00Z",
			[]string{"2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z", "2026-04-04T16:15:00Z"}},
		{"LordHoweDailyOnTheDayOfTheChange", protocol.ScheduleSpec{Cron: "0 0 3 * * *", TimeZone: "Australia/Lord_Howe"}, "2026-10-02T12:00:00Z",
			[]string{"2026-10-02T16:30:00Z", "2026-10-03T16:00:00Z", "2026-10-04T16:00:00Z"}},
		{"UTCByDefault", protocol.ScheduleSpec{Cron: "0 0 9 * * *"}, "2026-03-28T00:00:00Z",
			[]string{"2026-03-28T09:00:00Z", "2026-03-29T09:00:00Z"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sp := mustSpec(t, tc.spec, created)
			got := ticks(sp, utc(tc.from), len(tc.want))
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("ticks after %s\n got %v\nwant %v", tc.from, got, tc.want)
			}
		})
	}
}

// TestScheduleSpecRefused: what a schedule cannot be is refused with a reason.
func TestScheduleSpecRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		spec protocol.ScheduleSpec
		want string
	}{
		{"NoTime", protocol.ScheduleSpec{Name: "a"}, "give every or cron"},
		{"Both", protocol.ScheduleSpec{Name: "a", EveryMillis: 1000, Cron: "* * * * * *"}, "not both"},
		{"EveryTooShort", protocol.ScheduleSpec{Name: "a", EveryMillis: 999}, "every must be at least 1s, got 999ms"},
		{"EveryNegative", protocol.ScheduleSpec{Name: "a", EveryMillis: -5}, "every must be at least 1s"},
		{"EveryMostNegative", protocol.ScheduleSpec{Name: "a", EveryMillis: math.MinInt64}, "every must be at least 1s, got -9223372036854775808ms"},
		{"EveryTooLong", protocol.ScheduleSpec{Name: "a", EveryMillis: protocol.MaxScheduleEveryMillis + 1}, "every must be at most 3660 days, got 87840h0m0.001s"},
		{"EveryWrapsAround", protocol.ScheduleSpec{Name: "a", EveryMillis: math.MaxInt64}, "every must be at most 3660 days, got 9223372036854775807ms"},
		{"EveryWithZone", protocol.ScheduleSpec{Name: "a", EveryMillis: 1000, TimeZone: "UTC"}, "time zone applies to cron schedules only"},
		{"CronFiveFields", protocol.ScheduleSpec{Name: "a", Cron: "*/5 * * * *"}, `cron "*/5 * * * *": expected exactly 6 fields`},
		{"CronGarbage", protocol.ScheduleSpec{Name: "a", Cron: "0 61 * * * *"}, "end of range (61) above maximum (59)"},
		{"CronNever", protocol.ScheduleSpec{Name: "a", Cron: "0 0 0 30 2 *"}, "never fires"},
		{"CronAtEvery", protocol.ScheduleSpec{Name: "a", Cron: "@every 1m"}, "use every instead of @every"},
		{"CronZoneInSpec", protocol.ScheduleSpec{Name: "a", Cron: "CRON_TZ=Europe/Berlin 0 0 9 * * *"}, "not in the spec"},
		{"UnknownZone", protocol.ScheduleSpec{Name: "a", Cron: "0 0 9 * * *", TimeZone: "Mars/Olympus"}, `unknown time zone "Mars/Olympus"`},
		{"BadName", protocol.ScheduleSpec{Name: "a.b", EveryMillis: 1000}, "bad schedule name"},
		{"EmptyName", protocol.ScheduleSpec{EveryMillis: 1000}, "bad schedule name"},
		{"BadCatchUp", protocol.ScheduleSpec{Name: "a", EveryMillis: 1000, CatchUp: "some"}, "catch-up must be none, one or all"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseSpec(&tc.spec, utc("2026-01-01T00:00:00Z").UnixMilli())
			if !errors.Is(err, errInvalidSchedule) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parseSpec: %v, want an invalid schedule saying %q", err, tc.want)
			}
		})
	}
}

// TestCronHintOffersWhatIsTaken: a cron spec refused for its syntax is answered with
// the forms a schedule takes, and only those: the hint offered "@every 90s", which is
// then refused ("use every instead of @every").
func TestCronHintOffersWhatIsTaken(t *testing.T) {
	t.Parallel()
	_, err := parseSpec(&protocol.ScheduleSpec{Name: "a", Cron: "@fortnightly"}, utc("2026-01-01T00:00:00Z").UnixMilli())
	if err == nil || !strings.Contains(err.Error(), "@hourly") {
		t.Fatalf("parseSpec of a bad cron: %v, want the forms it takes", err)
	}
	if strings.Contains(err.Error(), "@every") {
		t.Errorf("parseSpec of a bad cron: %v; the hint offers @every, which is refused", err)
	}
}

// TestSchedulePlan: which due ticks run, by catch-up policy, after downtime
// (recovering) and when a timer fires (possibly late).
func TestSchedulePlan(t *testing.T) {
	t.Parallel()
	created := utc("2026-01-01T00:00:00Z")
	sp := mustSpec(t, protocol.ScheduleSpec{EveryMillis: 10000}, created)
	at := func(sec int) time.Time { return created.Add(time.Duration(sec) * time.Second) }
	cases := []struct {
		name       string
		catchUp    protocol.CatchUp
		recovering bool
		done, now  int // seconds after creation
		run        []int
		skipped    int
		next       int
	}{
		{"NothingDue", protocol.CatchUpOne, false, 0, 9, nil, 0, 10},
		{"OnTime", protocol.CatchUpNone, false, 0, 10, []int{10}, 0, 20},
		{"OnTimeOne", protocol.CatchUpOne, false, 10, 20, []int{20}, 0, 30},
		{"LateNoneRunsTheLatest", protocol.CatchUpNone, false, 0, 35, []int{30}, 2, 40},
		{"LateAllRunsEach", protocol.CatchUpAll, false, 0, 35, []int{10, 20, 30}, 0, 40},
		{"DowntimeNone", protocol.CatchUpNone, true, 10, 65, nil, 5, 70},
		{"DowntimeOne", protocol.CatchUpOne, true, 10, 65, []int{60}, 4, 70},
		{"DowntimeAll", protocol.CatchUpAll, true, 10, 65, []int{20, 30, 40, 50, 60}, 0, 70},
		{"RecoveringNothingMissed", protocol.CatchUpNone, true, 10, 15, nil, 0, 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := planTicks(sp, at(tc.done), at(tc.now), tc.catchUp, tc.recovering)
			var run []int
			for _, r := range p.run {
				run = append(run, int(r.Sub(created)/time.Second))
			}
			if fmt.Sprint(run) != fmt.Sprint(tc.run) {
				t.Errorf("run %v, want %v", run, tc.run)
			}
			if p.skipped != tc.skipped {
				t.Errorf("skipped %d, want %d", p.skipped, tc.skipped)
			}
			if !p.next.Equal(at(tc.next)) {
				t.Errorf("next %v, want %v", p.next.Sub(created), at(tc.next).Sub(created))
			}
		})
	}
}

// TestSchedulePlanLongDowntime: a year without a coordinator costs catch-up one a few
// steps, and catch-up all runs in rounds of maxPlanTicks.
func TestSchedulePlanLongDowntime(t *testing.T) {
	t.Parallel()
	created := utc("2026-01-01T00:00:00Z")
	now := created.Add(365*24*time.Hour + 500*time.Millisecond)
	for _, spec := range []protocol.ScheduleSpec{{EveryMillis: 1000}, {Cron: "* * * * * *"}} {
		sp := mustSpec(t, spec, created)
		start := time.Now()
		p := planTicks(sp, created, now, protocol.CatchUpOne, true)
		if len(p.run) != 1 || !p.run[0].Equal(created.Add(365*24*time.Hour)) || !p.next.Equal(p.run[0].Add(time.Second)) {
			t.Errorf("%+v: catch-up one ran %v, next %v; want the last second of the year", spec, p.run, p.next)
		}
		if p.skipped < maxPlanTicks {
			t.Errorf("%+v: skipped %d, want at least %d", spec, p.skipped, maxPlanTicks)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("%+v: plan took %v", spec, took)
		}
		all := planTicks(sp, created, now, protocol.CatchUpAll, true)
		if len(all.run) != maxPlanTicks || !all.next.Equal(created.Add((maxPlanTicks+1)*time.Second)) {
			t.Errorf("%+v: catch-up all ran %d, next %v; want a round of %d", spec, len(all.run), all.next, maxPlanTicks)
		}
	}
}
