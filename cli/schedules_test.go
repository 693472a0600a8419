package cli_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// TestScheduleCommands: jobbus schedule add, ls, trigger, pause, resume and rm, over
// NATS and the TCP client port, and their refusals: usage errors exit 2 before
// connecting, the coordinator's refusals exit 1 with its reason.
func TestScheduleCommands(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		out, _ := o.mustRun(0, "schedule", "add", "beat", "--every", "1s", "sha256", "--text", "hi")
		if !strings.HasPrefix(out, "schedule beat added: every 1s, next run ") {
			t.Fatalf("add said %q", out)
		}
		out, _ = o.mustRun(0, "schedule", "add", "nightly", "--cron", "0 0 3 * * *", "--tz", "Europe/Berlin", "WORD_COUNT", "--text", "a b", "--catch-up", "all", "--priority", "high", "--max-attempts", "2", "--json")
		var nightly protocol.Schedule
		if err := json.Unmarshal([]byte(out), &nightly); err != nil || nightly.Cron != "0 0 3 * * *" || nightly.TimeZone != "Europe/Berlin" ||
			nightly.CatchUp != protocol.CatchUpAll || nightly.TaskType != "WORD_COUNT" || nightly.NextTickMillis <= time.Now().UnixMilli() ||
			nightly.MaxAttempts != 2 || nightly.Priority == nil || *nightly.Priority != protocol.PriorityHigh {
			t.Fatalf("add --json: %s (%v)", out, err)
		}
		eventually(t, "a tick of beat listed", func() bool {
			out, _ := o.mustRun(0, "schedule", "ls", "--json")
			for _, sc := range jsonLines[protocol.Schedule](t, out) {
				if sc.Name == "beat" && sc.LastJobID != "" {
					return true
				}
			}
			return false
		})
		out, _ = o.mustRun(0, "schedule", "ls")
		for _, want := range []string{"NAME", "NEXT RUN", "LAST JOB", "beat", "active", "every 1s", "SHA256", "nightly", `cron "0 0 3 * * *" Europe/Berlin`, "WORD_COUNT"} {
			if !strings.Contains(out, want) {
				t.Errorf("ls lacks %q:\n%s", want, out)
			}
		}
		out, _ = o.mustRun(0, "schedule", "pause", "nightly")
		if out != "schedule nightly paused\n" {
			t.Errorf("pause said %q", out)
		}
		id, _ := o.mustRun(0, "schedule", "trigger", "nightly")
		id = strings.TrimSpace(id)
		out, _ = o.mustRun(0, "status", id, "--json")
		if j := jsonJob(t, out); j.TaskType != "WORD_COUNT" || j.Schedule != "nightly" || j.MaxAttempts != 2 || j.Priority != protocol.PriorityHigh {
			t.Errorf("the triggered job: %s", out)
		}
		if out, _ = o.mustRun(0, "status", id); !regexp.MustCompile(`(?m)^SCHEDULE\s+nightly$`).MatchString(out) {
			t.Errorf("status of the triggered job does not name its schedule:\n%s", out)
		}
		out, _ = o.mustRun(0, "schedule", "ls")
		if !strings.Contains(out, "paused") || !strings.Contains(out, id) {
			t.Errorf("ls after pause and trigger lacks the state or the job %s:\n%s", id, out)
		}
		out, _ = o.mustRun(0, "schedule", "resume", "nightly")
		if !strings.HasPrefix(out, "schedule nightly resumed, next run ") {
			t.Errorf("resume said %q", out)
		}
		o.mustRun(0, "schedule", "rm", "beat")
		out, _ = o.mustRun(0, "schedule", "ls", "--json")
		if scs := jsonLines[protocol.Schedule](t, out); len(scs) != 1 || scs[0].Name != "nightly" {
			t.Errorf("ls after rm: %s", out)
		}

		for _, tc := range []struct {
			args []string
			code int
			want string
		}{
			{[]string{"add", "x", "--every", "soon", "SHA256", "--text", "a"}, 2, `--every must be a duration such as 30s, 5m or 1h, got "soon"`},
			{[]string{"add", "x", "--every", "100ms", "SHA256", "--text", "a"}, 2, "--every must be at least 1s"},
			{[]string{"add", "x", "--every", "90000h", "SHA256", "--text", "a"}, 2, "--every 90000h0m0s is more than 3660 days"},
			{[]string{"add", "x", "SHA256", "--text", "a"}, 2, "give --every DURATION or --cron SPEC"},
			{[]string{"add", "x", "--every", "1s", "SHA256"}, 2, "SHA256 needs --text"},
			{[]string{"add", "x", "--every", "1s", "--catch-up", "some", "SHA256", "--text", "a"}, 2, "catch-up must be none, one or all"},
			{[]string{"add", "x", "--every", "1s", "SHA256", "--text", "a", "--max-attempts", "-1"}, 2, "--max-attempts must be 0 (the coordinator's default) or more, got -1"},
			{[]string{"add", "x", "--every", "1s", "SHA256", "--text", "a", "--priority", "urgent"}, 2, `--priority must be high, normal or low, got "urgent"`},
			{[]string{"add", "x", "--cron", "*/5 * * * *", "SHA256", "--text", "a"}, 1, "expected exactly 6 fields"},
			{[]string{"add", "x", "--cron", "0 0 * * * *", "--tz", "Mars/Base", "SHA256", "--text", "a"}, 1, `unknown time zone "Mars/Base"`},
			{[]string{"add", "x", "--every", "1s", "NO_SUCH_TYPE", "--payload", "{}"}, 1, "Unknown task type: NO_SUCH_TYPE"},
			{[]string{"add", "x", "--every", "1s", "PRIME_COUNT", "--payload", `{"limit":"many"}`}, 1, "Invalid payload"},
			{[]string{"add", "nightly", "--every", "1s", "SHA256", "--text", "a"}, 1, "Schedule 'nightly' already exists"},
			{[]string{"pause", "nope"}, 1, "Unknown schedule: nope"},
			{[]string{"resume", "nope"}, 1, "Unknown schedule: nope"},
			{[]string{"rm", "nope"}, 1, "Unknown schedule: nope"},
			{[]string{"trigger", "nope"}, 1, "Unknown schedule: nope"},
		} {
			code, out, errs := o.run(append([]string{"schedule"}, tc.args...)...)
			if code != tc.code || !strings.Contains(errs, tc.want) {
				t.Errorf("schedule %s: exit %d, stderr %q, stdout %q; want exit %d saying %q", strings.Join(tc.args, " "), code, errs, out, tc.code, tc.want)
			}
			if n := strings.Count(strings.ToLower(errs), "unknown schedule"); strings.HasPrefix(tc.want, "Unknown schedule") && n != 1 {
				t.Errorf("schedule %s: stderr %q says unknown schedule %d times, want once", strings.Join(tc.args, " "), errs, n)
			}
		}
	})
}

// TestScheduleSIGKILLAtTick: the leading coordinator SIGKILLed at the instant of a
// schedule's tick, twice: jobbus serve started again on its store, or a standby
// jobbus coordinator taking over. Either way every tick from the first to the last has
// exactly one job, found under the tick's key, and no tick has two. JOBBUS_LONG_TESTS=1
// kills six times each.
func TestScheduleSIGKILLAtTick(t *testing.T) {
	t.Parallel()
	t.Run("ServeRestarts", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		p, url := serveProc(t, dir, "--workers", "1")
		killAtTicks(t, client.New(natsConnect(t, url)), func() *client.Client {
			p.signal(syscall.SIGKILL)
			p.wait()
			p, url = serveProc(t, dir, "--workers", "1")
			return client.New(natsConnect(t, url))
		})
	})
	t.Run("StandbyTakesOver", func(t *testing.T) {
		t.Parallel()
		s := startNATS(t)
		lead, standby := s.leaderAndStandby()
		s.StartNativeWorker(t)
		cl := client.New(s.NC)
		killAtTicks(t, cl, func() *client.Client {
			killed := time.Now()
			lead.signal(syscall.SIGKILL)
			lead = standby
			servingSince(t, lead, killed)
			standby = startProc(t, nil, "--nats", s.url, "coordinator", "--http-listen", "-")
			standby.logged(`msg="standing by`)
			return cl
		})
	})
}

// killAtTicks adds a schedule ticking every second on cl, kills its coordinator at a
// tick twice, or six times with JOBBUS_LONG_TESTS=1 (kill returns the client to use
// after), and checks one job per tick.
func killAtTicks(t *testing.T, cl *client.Client, kill func() *client.Client) {
	ctx := context.Background()
	added, err := cl.AddSchedule(ctx, client.Schedule{Name: "tick", Every: time.Second, CatchUp: protocol.CatchUpAll,
		TaskType: "SHA256", Payload: map[string]string{"text": "t"}})
	if err != nil {
		t.Fatal(err)
	}
	schedule := func(cl *client.Client) protocol.Schedule {
		t.Helper()
		scs, err := cl.Schedules(ctx)
		if err != nil || len(scs) != 1 {
			t.Fatalf("schedules: %+v, %v", scs, err)
		}
		return scs[0]
	}
	offsets := []time.Duration{time.Millisecond, 4 * time.Millisecond}
	if longTests() { // more kills, spread over the tick's first milliseconds
		offsets = append(offsets, 0, 2*time.Millisecond, 8*time.Millisecond, 16*time.Millisecond)
	}
	for round, offset := range offsets {
		eventually(t, "two ticks done", func() bool { return schedule(cl).LastTickMillis >= added.CreatedAtMillis+int64(round+2)*1000 })
		next := time.UnixMilli(schedule(cl).NextTickMillis)
		time.Sleep(time.Until(next) + offset) // the fault's timing, not a synchronisation
		cl = kill()
		eventually(t, "ticks after the kill", func() bool { return schedule(cl).LastTickMillis > next.UnixMilli()+1000 })
	}
	sc, err := cl.PauseSchedule(ctx, "tick")
	if err != nil {
		t.Fatal(err)
	}
	list, err := cl.List(ctx, protocol.ListJobs{})
	if err != nil {
		t.Fatal(err)
	}
	jobs := map[string]bool{}
	for _, j := range list.Jobs {
		if j.Schedule == "tick" {
			jobs[j.JobID] = true
		}
	}
	ticks := int((sc.LastTickMillis - added.CreatedAtMillis) / 1000)
	seen := map[string]int{}
	for k := 1; k <= ticks; k++ {
		tick := added.CreatedAtMillis + int64(k)*1000
		id, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "t"}, client.IdempotencyKey(protocol.ScheduleTickKey("tick", tick)))
		switch {
		case err != nil:
			t.Fatalf("tick %d's key: %v", k, err)
		case !jobs[id]:
			t.Errorf("tick %d had no job: its key made a new one", k)
		case seen[id] != 0:
			t.Errorf("ticks %d and %d share job %s", seen[id], k, id)
		}
		seen[id] = k
	}
	if len(jobs) != ticks {
		t.Errorf("%d jobs of the schedule for %d ticks: a tick has more than one", len(jobs), ticks)
	}
	t.Logf("%d ticks across %d SIGKILLs at a tick, one job each", ticks, len(offsets))
}
