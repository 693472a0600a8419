package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/worker"
)

// fakeClock is a coordinator's Config.Now that moves only when told.
type fakeClock struct{ ms atomic.Int64 }

func newFakeClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.ms.Store(t.UnixMilli())
	return c
}

func (c *fakeClock) now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// tickCounter is an Observer that counts schedule ticks by outcome.
type tickCounter struct {
	mu sync.Mutex
	n  map[string]int // "name/outcome"
}

func (o *tickCounter) Submitted(coordinator.SubmitOutcome)    {}
func (o *tickCounter) JobChanged(coordinator.JobChange)       {}
func (o *tickCounter) DeadlineExpired(string)                 {}
func (o *tickCounter) Stored(time.Duration, error, bool, int) {}
func (o *tickCounter) Synced(time.Duration, int, error)       {}
func (o *tickCounter) count(name string, out coordinator.ScheduleOutcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[name+"/"+string(out)]
}

func (o *tickCounter) ScheduleTicked(name string, out coordinator.ScheduleOutcome, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = make(map[string]int)
	}
	o.n[name+"/"+string(out)] += n
}

// scheduleJobs lists the jobs schedule name submitted, oldest first.
func scheduleJobs(t *testing.T, s *system, name string) []protocol.Job {
	t.Helper()
	list, err := s.Client.List(context.Background(), protocol.ListJobs{})
	if err != nil {
		t.Fatal(err)
	}
	var out []protocol.Job
	for _, j := range list.Jobs {
		if j.Schedule == name {
			out = append(out, j)
		}
	}
	slices.Reverse(out)
	return out
}

func scheduleNamed(t *testing.T, s *system, name string) protocol.Schedule {
	t.Helper()
	scs, err := s.Client.Schedules(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range scs {
		if sc.Name == name {
			return sc
		}
	}
	t.Fatalf("schedule %s not listed: %+v", name, scs)
	return protocol.Schedule{}
}

func addSchedule(t *testing.T, s *system, sc client.Schedule) protocol.Schedule {
	t.Helper()
	got, err := s.Client.AddSchedule(context.Background(), sc)
	if err != nil {
		t.Fatalf("add schedule %s: %v", sc.Name, err)
	}
	return got
}

// TestScheduleEveryRuns: an every schedule submits one job per tick, each carrying
// the schedule's name, and lists its next tick, its last tick and that tick's job.
// The coordinator's clock moves a tick at a time when the test moves it: on the real
// clock, a loaded machine that fired the first tick's timer only after the second's
// time made one job of both (catch-up one), and the test found 1 job after two ticks.
func TestScheduleEveryRuns(t *testing.T) {
	t.Parallel()
	clock := newFakeClock(time.Now())
	s := setup(t, func(c *coordinator.Config) { c.Now = clock.now })
	s.StartWorker(2)
	added := addSchedule(t, s, client.Schedule{Name: "hash", Every: time.Second, TaskType: "SHA256", Payload: text("tick")})
	if added.NextTickMillis != added.CreatedAtMillis+1000 || added.CatchUp != protocol.CatchUpOne || added.Paused {
		t.Fatalf("added %+v: want the first tick a second after creation, catch-up one, active", added)
	}
	for tick := int64(1); tick <= 2; tick++ {
		clock.advance(time.Second)
		s.Eventually(fmt.Sprintf("tick %d done", tick), func() bool {
			return scheduleNamed(t, s, "hash").LastTickMillis == added.CreatedAtMillis+1000*tick
		})
	}
	jobs := scheduleJobs(t, s, "hash")
	if len(jobs) != 2 {
		t.Fatalf("%d jobs after two ticks, want one a tick", len(jobs))
	}
	for _, j := range jobs {
		if j.TaskType != "SHA256" {
			t.Errorf("job %+v: want a SHA256 job", j)
		}
	}
	done := s.Wait(jobs[0].JobID)
	if done.State != protocol.StateCompleted {
		t.Errorf("the first tick's job ended %s", done.State)
	}
	sc := scheduleNamed(t, s, "hash")
	if sc.LastTickMillis < added.CreatedAtMillis+2000 || (sc.LastTickMillis-added.CreatedAtMillis)%1000 != 0 {
		t.Errorf("last tick %d: want a whole second after creation %d, two at least", sc.LastTickMillis, added.CreatedAtMillis)
	}
	if sc.LastJobID == "" || sc.NextTickMillis <= sc.LastTickMillis || sc.LastError != "" {
		t.Errorf("listed %+v: want the last job, a next tick after the last, no error", sc)
	}
}

// TestScheduleRefusals: what cannot be a schedule is refused with an error that says
// why, and nothing is stored.
func TestScheduleRefusals(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	addSchedule(t, s, client.Schedule{Name: "taken", Every: time.Hour, TaskType: "SHA256", Payload: text("x")})
	cases := []struct {
		name string
		sc   client.Schedule
		want string
	}{
		{"BadCron", client.Schedule{Name: "a", Cron: "0 */5 * * *", TaskType: "SHA256", Payload: text("x")}, "Invalid schedule: cron \"0 */5 * * *\": expected exactly 6 fields"},
		{"BadEvery", client.Schedule{Name: "a", Every: 10 * time.Millisecond, TaskType: "SHA256", Payload: text("x")}, "Invalid schedule: every must be at least 1s"},
		{"NoTime", client.Schedule{Name: "a", TaskType: "SHA256", Payload: text("x")}, "Invalid schedule: give every or cron"},
		{"BadZone", client.Schedule{Name: "a", Cron: "0 0 * * * *", TimeZone: "Nowhere/City", TaskType: "SHA256", Payload: text("x")}, "unknown time zone"},
		{"BadCatchUp", client.Schedule{Name: "a", Every: time.Hour, CatchUp: "twice", TaskType: "SHA256", Payload: text("x")}, "catch-up must be none, one or all"},
		{"BadName", client.Schedule{Name: "a b", Every: time.Hour, TaskType: "SHA256", Payload: text("x")}, "bad schedule name"},
		{"UnknownType", client.Schedule{Name: "a", Every: time.Hour, TaskType: "NO_SUCH", Payload: text("x")}, "Unknown task type: NO_SUCH"},
		{"BadPayload", client.Schedule{Name: "a", Every: time.Hour, TaskType: "SLEEP", Payload: map[string]any{"durationMillis": "soon"}}, "Invalid payload: Field 'durationMillis' must be an integer"},
		{"PayloadNotObject", client.Schedule{Name: "a", Every: time.Hour, TaskType: "SHA256", Payload: []int{1}}, "Invalid payload"},
		{"Duplicate", client.Schedule{Name: "taken", Every: time.Minute, TaskType: "SHA256", Payload: text("y")}, "Schedule 'taken' already exists"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Client.AddSchedule(ctx, tc.sc)
			if !errors.Is(err, client.ErrServer) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("add: %v, want an ERROR saying %q", err, tc.want)
			}
		})
	}
	for _, op := range []struct {
		name string
		do   func(string) error
	}{
		{"Pause", func(n string) error { _, err := s.Client.PauseSchedule(ctx, n); return err }},
		{"Resume", func(n string) error { _, err := s.Client.ResumeSchedule(ctx, n); return err }},
		{"Remove", func(n string) error { _, err := s.Client.RemoveSchedule(ctx, n); return err }},
		{"Trigger", func(n string) error { _, err := s.Client.TriggerSchedule(ctx, n); return err }},
	} {
		t.Run("Unknown"+op.name, func(t *testing.T) {
			err := op.do("nope")
			// The coordinator's text, said once: the sentinel matches without
			// prefixing its own "unknown schedule" to it.
			if !errors.Is(err, client.ErrUnknownSchedule) || !errors.Is(err, client.ErrServer) || err.Error() != "Unknown schedule: nope" {
				t.Fatalf("%s of an unknown schedule: %v; want ErrUnknownSchedule reading %q", op.name, err, "Unknown schedule: nope")
			}
		})
	}
	scs, err := s.Client.Schedules(ctx)
	if err != nil || len(scs) != 1 || scs[0].Name != "taken" || scs[0].TaskType != "SHA256" || string(scs[0].Payload) != `{"text":"x"}` {
		t.Fatalf("schedules after the refusals: %+v, %v; want only the first one, unchanged", scs, err)
	}
}

// TestSchedulePauseResumeTriggerRemove: a paused schedule ticks no more (its ticks
// are not caught up on resume) but can be triggered; removed, it is gone and its jobs
// stay.
func TestSchedulePauseResumeTriggerRemove(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	added := addSchedule(t, s, client.Schedule{Name: "beat", Every: time.Second, TaskType: "SHA256", Payload: text("b")})
	s.Eventually("a first tick", func() bool { return len(scheduleJobs(t, s, "beat")) >= 1 })
	paused, err := s.Client.PauseSchedule(ctx, "beat")
	if err != nil || !paused.Paused || paused.NextTickMillis != 0 {
		t.Fatalf("pause: %+v, %v; want paused with no next tick", paused, err)
	}
	n := len(scheduleJobs(t, s, "beat"))
	// Absence takes waiting: two periods of a schedule that would have ticked twice.
	time.Sleep(2200 * time.Millisecond)
	if got := len(scheduleJobs(t, s, "beat")); got != n {
		t.Fatalf("%d jobs while paused, %d before: a paused schedule ticked", got, n)
	}
	id, err := s.Client.TriggerSchedule(ctx, "beat")
	if err != nil {
		t.Fatalf("trigger while paused: %v", err)
	}
	if j := s.Status(id); j.Schedule != "beat" || j.TaskType != "SHA256" {
		t.Fatalf("triggered job %+v: want the schedule's", j)
	}
	if sc := scheduleNamed(t, s, "beat"); sc.LastJobID != id || !sc.Paused {
		t.Fatalf("after the trigger %+v: want its job as the last, still paused", sc)
	}
	resumed, err := s.Client.ResumeSchedule(ctx, "beat")
	if err != nil || resumed.Paused || resumed.SinceMillis <= paused.SinceMillis || resumed.NextTickMillis <= resumed.SinceMillis {
		t.Fatalf("resume: %+v, %v; want active, counting from now", resumed, err)
	}
	s.Eventually("a tick after the resume", func() bool {
		return scheduleNamed(t, s, "beat").LastTickMillis > resumed.SinceMillis
	})
	// One tick after the resume, and none of the ones missed while paused.
	if got := len(scheduleJobs(t, s, "beat")); got > n+1+3 {
		t.Fatalf("%d jobs after the resume, %d before the pause: the paused ticks were caught up", got, n)
	}
	if (scheduleNamed(t, s, "beat").LastTickMillis-added.CreatedAtMillis)%1000 != 0 {
		t.Fatalf("a tick off the schedule's grid after the resume")
	}
	removed, err := s.Client.RemoveSchedule(ctx, "beat")
	if err != nil || removed.Name != "beat" {
		t.Fatalf("remove: %+v, %v", removed, err)
	}
	if scs, err := s.Client.Schedules(ctx); err != nil || len(scs) != 0 {
		t.Fatalf("schedules after the removal: %+v, %v", scs, err)
	}
	if j := s.Status(id); j.JobID != id {
		t.Fatalf("the triggered job is gone with its schedule")
	}
	// Gone means gone: the name is free again.
	addSchedule(t, s, client.Schedule{Name: "beat", Every: time.Hour, TaskType: "SHA256", Payload: text("c")})
}

// TestScheduleCatchUpAfterDowntime: ticks that passed while no coordinator ran are
// caught up by the schedule's policy when the next one starts, and only once: a
// further restart submits nothing more. The clock is injected, so hours pass at once.
func TestScheduleCatchUpAfterDowntime(t *testing.T) {
	t.Parallel()
	cases := []struct {
		catchUp protocol.CatchUp
		want    []int // hours after creation of the ticks that got jobs
	}{
		{protocol.CatchUpNone, nil},
		{protocol.CatchUpOne, []int{3}},
		{protocol.CatchUpAll, []int{1, 2, 3}},
	}
	for _, tc := range cases {
		t.Run(string(tc.catchUp), func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock(time.Now())
			obs := &tickCounter{}
			s := setup(t, func(c *coordinator.Config) { c.Now = clock.now; c.Observer = obs })
			added := addSchedule(t, s, client.Schedule{Name: "hourly", Every: time.Hour, CatchUp: tc.catchUp, TaskType: "SHA256", Payload: text("h")})
			_ = s.Coordinator.Close()
			clock.advance(3*time.Hour + 30*time.Minute)
			s.RestartCoordinator(t)
			created := added.CreatedAtMillis
			var wantLast int64 // no tick done: none was run
			if len(tc.want) > 0 {
				wantLast = created + int64(tc.want[len(tc.want)-1])*time.Hour.Milliseconds()
			}
			wantNext := created + 4*time.Hour.Milliseconds() // the first tick after now
			s.Eventually("the catch-up done", func() bool {
				sc := scheduleNamed(t, s, "hourly")
				return len(scheduleJobs(t, s, "hourly")) == len(tc.want) && sc.LastTickMillis == wantLast && sc.NextTickMillis == wantNext
			})
			if tc.catchUp == protocol.CatchUpNone && obs.count("hourly", coordinator.ScheduleSkipped) != 3 {
				t.Errorf("skipped ticks counted %d, want 3", obs.count("hourly", coordinator.ScheduleSkipped))
			}
			// Each job is its tick's: its key finds it.
			jobs := scheduleJobs(t, s, "hourly")
			for i, h := range tc.want {
				key := protocol.ScheduleTickKey("hourly", created+int64(h)*time.Hour.Milliseconds())
				id, err := s.Client.Submit(context.Background(), "SHA256", text("h"), client.IdempotencyKey(key))
				if err != nil || id != jobs[i].JobID {
					t.Errorf("tick %dh's key: job %s, %v; want %s", h, id, err, jobs[i].JobID)
				}
			}
			before := len(scheduleJobs(t, s, "hourly"))
			s.RestartCoordinator(t)
			s.Eventually("schedules loaded", func() bool { return scheduleNamed(t, s, "hourly").NextTickMillis != 0 })
			if got := len(scheduleJobs(t, s, "hourly")); got != before {
				t.Errorf("%d jobs after a second restart, %d before: a tick was submitted twice", got, before)
			}
		})
	}
}

// TestScheduleFailsVisibly: a schedule whose payload stops being valid (its task
// type's schema changed) keeps ticking, each tick refused: the error, how many ticks
// in a row failed and a metric say so, until a tick succeeds again.
func TestScheduleFailsVisibly(t *testing.T) {
	t.Parallel()
	obs := &tickCounter{}
	s := setup(t, func(c *coordinator.Config) { c.Observer = obs })
	declare := func(schema string) func() {
		_, stop := s.StartFunctionWorker(t, func(w *worker.Worker) error {
			return w.Handle("REPORT", func(context.Context, int, json.RawMessage) (string, error) { return "ok", nil },
				worker.Schema(json.RawMessage(schema)))
		})
		return stop
	}
	stop := declare(`{"type":"object"}`)
	s.Eventually("REPORT declared", func() bool {
		_, err := s.Client.AddSchedule(context.Background(), client.Schedule{Name: "report", Every: time.Second, TaskType: "REPORT", Payload: map[string]int{"day": 1}})
		return err == nil
	})
	stop()
	// A worker declares the type again with a schema the schedule's payload breaks.
	declare(`{"type":"object","required":["week"]}`)
	s.Eventually("two refused ticks", func() bool { return scheduleNamed(t, s, "report").Failures >= 2 })
	sc := scheduleNamed(t, s, "report")
	if !strings.HasPrefix(sc.LastError, "Invalid payload") || sc.LastErrorMillis == 0 || sc.Paused || sc.NextTickMillis == 0 {
		t.Fatalf("failing schedule listed %+v: want the refusal, and still ticking", sc)
	}
	if n := obs.count("report", coordinator.ScheduleFailed); n < 2 {
		t.Fatalf("%d failed ticks counted, want 2 at least", n)
	}
	if _, err := s.Client.TriggerSchedule(context.Background(), "report"); err == nil || !strings.Contains(err.Error(), "Invalid payload") {
		t.Fatalf("trigger of the failing schedule: %v, want its refusal", err)
	}
}

// TestScheduleCronAcrossDST: a cron schedule, its coordinator down across each DST
// change of its zone (an injected clock), catches up with catch-up all exactly the ticks
// of wall time. In Europe/Berlin, the spring 02:30 that does not exist runs at the
// change, and the autumn 02:30 that happens twice runs once. Australia/Lord_Howe's
// clocks move by 30 minutes (+10:30 to +11 at 02:00 on 4 October 2026, back at 02:00
// on 5 April): the hourly schedule's 02:00, skipped in spring though 02:30-02:59
// exist, runs at the change, and a daily one runs on the day of each change and the
// day after, where robfig/cron alone lost a day.
func TestScheduleCronAcrossDST(t *testing.T) {
	t.Parallel()
	utc := func(s string) time.Time {
		at, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	const berlin, lordHowe = "Europe/Berlin", "Australia/Lord_Howe"
	cases := []struct {
		name, zone, cron string
		from, to         string
		wantTicks        []string
	}{
		{"BerlinSpring", berlin, "0 30 2 * * *", "2026-03-28T12:00:00Z", "2026-03-30T12:00:00Z",
			[]string{"2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"}},
		{"BerlinAutumn", berlin, "0 30 2 * * *", "2026-10-24T12:00:00Z", "2026-10-26T12:00:00Z",
			[]string{"2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		{"LordHoweHourlySpring", lordHowe, "0 0 * * * *", "2026-10-03T13:00:00Z", "2026-10-03T17:00:00Z",
			[]string{"2026-10-03T13:30:00Z", "2026-10-03T14:30:00Z", "2026-10-03T15:30:00Z", "2026-10-03T16:00:00Z", "2026-10-03T17:00:00Z"}},
		{"LordHoweHourlyAutumn", lordHowe, "0 0 * * * *", "2026-04-04T12:00:00Z", "2026-04-04T16:30:00Z",
			[]string{"2026-04-04T13:00:00Z", "2026-04-04T14:00:00Z", "2026-04-04T15:30:00Z", "2026-04-04T16:30:00Z"}},
		{"LordHoweDailySpring", lordHowe, "0 0 3 * * *", "2026-10-02T12:00:00Z", "2026-10-05T12:00:00Z",
			[]string{"2026-10-02T16:30:00Z", "2026-10-03T16:00:00Z", "2026-10-04T16:00:00Z"}},
		{"LordHoweDailyAutumn", lordHowe, "0 0 3 * * *", "2026-04-03T12:00:00Z", "2026-04-06T12:00:00Z",
			[]string{"2026-04-03T16:00:00Z", "2026-04-04T16:30:00Z", "2026-04-05T16:30:00Z"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock(utc(tc.from))
			s := setup(t, func(c *coordinator.Config) { c.Now = clock.now })
			addSchedule(t, s, client.Schedule{Name: "night", Cron: tc.cron, TimeZone: tc.zone, CatchUp: protocol.CatchUpAll,
				TaskType: "SHA256", Payload: text("n")})
			_ = s.Coordinator.Close()
			clock.ms.Store(utc(tc.to).UnixMilli())
			s.RestartCoordinator(t)
			last := utc(tc.wantTicks[len(tc.wantTicks)-1]).UnixMilli()
			s.Eventually("the catch-up done", func() bool { return scheduleNamed(t, s, "night").LastTickMillis >= last })
			jobs := scheduleJobs(t, s, "night")
			ran := make(map[string]bool)
			for _, j := range jobs {
				ran[j.JobID] = true
			}
			var missing []string
			for _, tick := range tc.wantTicks {
				key := protocol.ScheduleTickKey("night", utc(tick).UnixMilli())
				id, err := s.Client.Submit(context.Background(), "SHA256", text("n"), client.IdempotencyKey(key))
				if err != nil {
					t.Fatal(err)
				}
				if !ran[id] {
					missing = append(missing, tick)
				}
			}
			if len(missing) > 0 || len(jobs) != len(tc.wantTicks) {
				t.Fatalf("%d jobs, want one for each of %v; no job for %v", len(jobs), tc.wantTicks, missing)
			}
		})
	}
}

// TestScheduleListFitsOneReply: schedules whose payloads together exceed a reply are
// listed without their payloads rather than not at all.
func TestScheduleListFitsOneReply(t *testing.T) {
	t.Parallel()
	s := setup(t)
	big := strings.Repeat("x", 190_000)
	for i := range 7 {
		addSchedule(t, s, client.Schedule{Name: fmt.Sprintf("big%d", i), Every: time.Hour, TaskType: "SHA256", Payload: text(big)})
	}
	scs, err := s.Client.Schedules(context.Background())
	if err != nil || len(scs) != 7 {
		t.Fatalf("list: %d schedules, %v", len(scs), err)
	}
	for _, sc := range scs {
		if sc.Payload != nil || sc.TaskType != "SHA256" || sc.NextTickMillis == 0 {
			t.Fatalf("listed %s with a %d-byte payload, task %q, next %d", sc.Name, len(sc.Payload), sc.TaskType, sc.NextTickMillis)
		}
	}
}

// TestScheduleRetriesATickNotStored: a tick refused for now (the coordinator at
// capacity) shows its error and is tried again under its key until it is stored; with
// catch-up all, no tick is lost meanwhile, and each has one job.
func TestScheduleRetriesATickNotStored(t *testing.T) {
	t.Parallel()
	obs := &tickCounter{}
	s := setup(t, func(c *coordinator.Config) { c.MaxActiveJobs = 2; c.Observer = obs })
	ctx := context.Background()
	var blockers []string // no worker yet: they stay QUEUED, and the coordinator is full
	for range 2 {
		blockers = append(blockers, s.Submit("SLEEP", map[string]int{"durationMillis": 1}))
	}
	added := addSchedule(t, s, client.Schedule{Name: "full", Every: time.Second, CatchUp: protocol.CatchUpAll, TaskType: "SHA256", Payload: text("f")})
	s.Eventually("a tick refused for now", func() bool {
		sc := scheduleNamed(t, s, "full")
		return sc.Failures >= 1 && strings.Contains(sc.LastError, "coordinator at capacity") && sc.LastTickMillis == 0
	})
	if n := obs.count("full", coordinator.ScheduleRetried); n < 1 {
		t.Fatalf("%d retried ticks counted", n)
	}
	// A trigger at capacity is a rejection worth retrying, as a submission's is (the
	// CLI's exit 3), not an error.
	if _, err := s.Client.TriggerSchedule(ctx, "full"); !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), "coordinator at capacity") {
		t.Fatalf("trigger at capacity: %v, want client.ErrRejected", err)
	}
	for _, id := range blockers {
		if _, _, err := s.Client.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.StartWorker(2)
	s.Eventually("ticks stored again", func() bool {
		sc := scheduleNamed(t, s, "full")
		return sc.LastError == "" && sc.LastTickMillis >= added.CreatedAtMillis+3000
	})
	sc, err := s.Client.PauseSchedule(ctx, "full")
	if err != nil {
		t.Fatal(err)
	}
	jobs := map[string]bool{}
	for _, j := range scheduleJobs(t, s, "full") {
		jobs[j.JobID] = true
	}
	ticks := int((sc.LastTickMillis - added.CreatedAtMillis) / 1000)
	if len(jobs) != ticks {
		t.Fatalf("%d jobs for %d ticks", len(jobs), ticks)
	}
	for k := 1; k <= ticks; k++ {
		key := protocol.ScheduleTickKey("full", added.CreatedAtMillis+int64(k)*1000)
		// The tick's own key finds its job (the same submission, so no conflict).
		id, err := s.Client.Submit(ctx, "SHA256", text("f"), client.IdempotencyKey(key))
		if err != nil || !jobs[id] {
			t.Errorf("tick %d: its key gives %s, %v: not one of the schedule's jobs", k, id, err)
		}
	}
}

// TestScheduleTriggersEachRun: every trigger is a run of its own, even two in the same
// millisecond or one on the millisecond of a tick (each got the other's job, keyed by
// the millisecond alone).
func TestScheduleTriggersEachRun(t *testing.T) {
	t.Parallel()
	clock := newFakeClock(time.Now().Truncate(time.Second))
	s := setup(t, func(c *coordinator.Config) { c.Now = clock.now })
	ctx := context.Background()
	added := addSchedule(t, s, client.Schedule{Name: "often", Every: time.Minute, TaskType: "SHA256", Payload: text("o")})
	clock.advance(time.Minute) // onto the first tick's millisecond, and held there
	// The tick's job is stored before the schedule records the tick: wait for both.
	first := added.CreatedAtMillis + time.Minute.Milliseconds()
	s.Eventually("the first tick, recorded", func() bool {
		return len(scheduleJobs(t, s, "often")) == 1 && scheduleNamed(t, s, "often").LastTickMillis == first
	})
	tick := scheduleJobs(t, s, "often")[0].JobID
	seen := map[string]bool{tick: true}
	for i := range 2 {
		id, err := s.Client.TriggerSchedule(ctx, "often")
		if err != nil {
			t.Fatalf("trigger %d: %v", i, err)
		}
		if seen[id] {
			t.Fatalf("trigger %d answered job %s, which an earlier run of the same millisecond made", i, id)
		}
		seen[id] = true
	}
	if got := len(scheduleJobs(t, s, "often")); got != 3 {
		t.Fatalf("%d jobs, want a tick's and two triggers'", got)
	}
}

// TestScheduleResumeWhileActive: resuming a schedule that is not paused changes
// nothing; it re-armed the schedule at its tick, so that a tick waiting out a retry's
// backoff was tried again at once.
func TestScheduleResumeWhileActive(t *testing.T) {
	t.Parallel()
	obs := &tickCounter{}
	s := setup(t, func(c *coordinator.Config) { c.MaxActiveJobs = 1; c.Observer = obs })
	ctx := context.Background()
	s.Submit("SLEEP", map[string]int{"durationMillis": 1}) // no worker: the coordinator stays full
	addSchedule(t, s, client.Schedule{Name: "full", Every: time.Second, TaskType: "SHA256", Payload: text("f")})
	// After its second failure a tick waits 2 s before it is tried again.
	s.Eventually("a tick refused twice", func() bool { return obs.count("full", coordinator.ScheduleRetried) >= 2 })
	before := scheduleNamed(t, s, "full")
	retried := obs.count("full", coordinator.ScheduleRetried)
	if before.NextTickMillis <= time.Now().UnixMilli() {
		t.Fatalf("next tick %d: want the retry, ahead", before.NextTickMillis)
	}
	resumed, err := s.Client.ResumeSchedule(ctx, "full")
	if err != nil {
		t.Fatal(err)
	}
	if resumed.NextTickMillis != before.NextTickMillis || resumed.SinceMillis != before.SinceMillis {
		t.Fatalf("resumed while active: next %d since %d, want %d and %d as before",
			resumed.NextTickMillis, resumed.SinceMillis, before.NextTickMillis, before.SinceMillis)
	}
	if n := obs.count("full", coordinator.ScheduleRetried); n > retried+1 {
		t.Fatalf("%d retries after the resume, %d before: the resume skipped the backoff", n, retried)
	}
}

// TestScheduleEveryBeyondRangeIsRefused: a period the client's Duration cannot carry
// but the wire can (everyMillis near the int64 range) is refused with the bound, as
// one too short is. Taken, its first tick wrapped around into the past: the tick
// spun for ever looking for the latest due tick, holding the schedule so that its
// rm never answered, and the coordinator could not stop.
func TestScheduleEveryBeyondRangeIsRefused(t *testing.T) {
	t.Parallel()
	s := setup(t)
	for _, every := range []int64{math.MaxInt64, protocol.MaxScheduleEveryMillis + 1} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		spec := protocol.ScheduleSpec{Name: "far", EveryMillis: every, TaskType: "SHA256", Payload: rawJSON(`{"text":"x"}`)}
		m, err := s.Client.Do(ctx, &protocol.AddSchedule{Schedule: spec})
		cancel()
		if err != nil {
			t.Fatalf("add every %dms: %v", every, err)
		}
		e, ok := m.(*protocol.Error)
		if !ok || !strings.HasPrefix(e.Message, "Invalid schedule: every must be at most 3660 days, got ") {
			t.Errorf("add every %dms: answered %#v, want it refused naming the bound", every, m)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := s.Client.RemoveSchedule(ctx, "far")
			cancel()
			if err != nil {
				t.Fatalf("rm of the schedule taken: %v", err)
			}
		}
	}
	// The longest period allowed is taken, and its next tick is that far ahead.
	longest := time.Duration(protocol.MaxScheduleEveryMillis) * time.Millisecond
	sc := addSchedule(t, s, client.Schedule{Name: "decade", Every: longest, TaskType: "SHA256", Payload: text("x")})
	if sc.NextTickMillis != sc.CreatedAtMillis+protocol.MaxScheduleEveryMillis {
		t.Fatalf("added %+v: want its next tick %v after its creation", sc, longest)
	}
}

// TestScheduleRefusesPayloadWithoutItsKey: a schedule of a task type that takes its
// concurrency key from the payload is refused when added if its payload does not
// resolve the pointer, as its every tick would be (docs/later.md: a schedule that could
// not submit is refused when you add it). It was taken, and each tick then failed.
func TestScheduleRefusesPayloadWithoutItsKey(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("MAIL", func(context.Context, int, json.RawMessage) (string, error) { return "ok", nil },
			worker.ConcurrencyKeyFrom("/customer/id"), worker.KeyConcurrency(1))
	})
	ctx := context.Background()
	var err error
	s.Eventually("MAIL declared", func() bool {
		_, err = s.Client.AddSchedule(ctx, client.Schedule{Name: "keyless", Every: time.Hour, TaskType: "MAIL", Payload: map[string]any{"to": "x"}})
		return err == nil || !strings.Contains(err.Error(), "Unknown task type")
	})
	if !errors.Is(err, client.ErrServer) || !strings.Contains(err.Error(), "Invalid payload: task type MAIL takes its concurrency key from the payload at /customer/id") {
		t.Fatalf("add of a schedule whose payload has no key: %v, want Invalid payload naming the pointer", err)
	}
	if scs, err := s.Client.Schedules(ctx); err != nil || len(scs) != 0 {
		t.Fatalf("schedules after the refusal: %+v, %v; want none", scs, err)
	}
	// One whose payload resolves the pointer is taken, and its job runs.
	addSchedule(t, s, client.Schedule{Name: "keyed", Every: time.Hour, TaskType: "MAIL", Payload: map[string]any{"customer": map[string]int{"id": 7}}})
	id, err := s.Client.TriggerSchedule(ctx, "keyed")
	if err != nil {
		t.Fatalf("trigger: %v", err)
	}
	if j := s.Wait(id); j.State != protocol.StateCompleted {
		t.Fatalf("triggered job %+v: want COMPLETED", j)
	}
}

// TestScheduleRefusesOptionsItCannotCarry: a schedule carries a submission's max
// attempts and priority only; any other submit option given to AddSchedule (a queue,
// a concurrency key, a run time, uniqueness, parents, an idempotency key) is refused
// rather than dropped: the schedule's jobs went to the default queue, unkeyed.
func TestScheduleRefusesOptionsItCannotCarry(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	for name, opt := range map[string]client.SubmitOption{
		"queue":          client.Queue("reports"),
		"concurrencyKey": client.ConcurrencyKey("c1"),
		"runInMillis":    client.RunIn(time.Minute),
		"uniqueWhile":    client.UniqueWhileActive(),
		"after":          client.After("some-job"),
		"idempotencyKey": client.IdempotencyKey("k"),
	} {
		_, err := s.Client.AddSchedule(ctx, client.Schedule{Name: "opts", Every: time.Hour, TaskType: "SHA256", Payload: text("x"),
			Options: []client.SubmitOption{client.MaxAttempts(2), opt}})
		if err == nil || !strings.Contains(err.Error(), "a schedule's options are MaxAttempts and Priority only; got "+name) {
			t.Errorf("add with option %s: %v, want it refused naming the option", name, err)
		}
	}
	if scs, err := s.Client.Schedules(ctx); err != nil || len(scs) != 0 {
		t.Fatalf("schedules after the refusals: %+v, %v; want none", scs, err)
	}
	sc := addSchedule(t, s, client.Schedule{Name: "opts", Every: time.Hour, TaskType: "SHA256", Payload: text("x"),
		Options: []client.SubmitOption{client.MaxAttempts(2), client.Priority(protocol.PriorityHigh)}})
	if sc.MaxAttempts != 2 || sc.Priority == nil || *sc.Priority != protocol.PriorityHigh {
		t.Fatalf("added %+v: want max attempts 2, priority HIGH", sc)
	}
}
