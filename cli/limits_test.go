package cli_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/worker"
)

// TestLimitCommands: jobbus limit set, ls and rm, over both transports.
func TestLimitCommands(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		out, _ := o.mustRun(cli.ExitOK, "limit", "set", "--type", "sha256", "--rate", "100/m", "--burst", "10")
		if !strings.Contains(out, "LIMIT") || !strings.Contains(out, "type SHA256") || !strings.Contains(out, "100/m") || !strings.Contains(out, "10.00") {
			t.Fatalf("limit set printed %q, want the limit's state: type SHA256, 100/m, 10 tokens", out)
		}
		o.mustRun(cli.ExitOK, "limit", "set", "--queue", "low", "--rate", "5/s")
		out, _ = o.mustRun(cli.ExitOK, "limit", "ls", "--json")
		infos := jsonLines[protocol.LimitInfo](t, out)
		if len(infos) != 2 || infos[0].Scope != "queue" || infos[0].Name != "low" || infos[0].Burst != 1 ||
			infos[1].Name != "SHA256" || infos[1].Rate != "100/m" || infos[1].Burst != 10 || infos[1].PerSecond < 1.66 || infos[1].PerSecond > 1.67 {
			t.Fatalf("limit ls --json: %+v", infos)
		}
		// Lowered to 1/h with burst 2: the bucket keeps 2 of its tokens, so two jobs
		// start and the third waits QUEUED.
		o.mustRun(cli.ExitOK, "limit", "set", "--type", "SHA256", "--rate", "1/h", "--burst", "2")
		for range 2 {
			o.mustRun(cli.ExitOK, "submit", "SHA256", "--text", "x", "--wait")
		}
		id, _ := o.mustRun(cli.ExitOK, "submit", "SHA256", "--text", "third")
		out, _ = o.mustRun(cli.ExitOK, "status", "--json", strings.TrimSpace(id))
		if j := jsonJob(t, out); j.State != protocol.StateQueued {
			t.Fatalf("the third job: %+v, want QUEUED (1/h, burst 2)", j)
		}
		out, _ = o.mustRun(cli.ExitOK, "limit", "ls")
		if !strings.Contains(out, "NEXT TOKEN") || !strings.Contains(out, "in 59m") {
			t.Fatalf("limit ls printed %q, want the next token in 59m...", out)
		}
		out, _ = o.mustRun(cli.ExitOK, "limit", "rm", "--type", "SHA256")
		if strings.TrimSpace(out) != "removed the limit of type SHA256 (1/h, burst 2)" {
			t.Fatalf("limit rm printed %q", out)
		}
		o.mustRun(cli.ExitOK, "wait", strings.TrimSpace(id))
		_, errs := o.mustRun(cli.ExitError, "limit", "rm", "--type", "SHA256")
		if !strings.Contains(errs, "Unknown limit: type SHA256") {
			t.Fatalf("rm of a limit not set: %q", errs)
		}
	})
}

// TestLimitSetKeepsBurst: limit set without --burst changes the rate and keeps the
// burst set earlier, as queue set keeps a limit not given; a new limit's burst is 1.
func TestLimitSetKeepsBurst(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		o.mustRun(cli.ExitOK, "limit", "set", "--type", "SHA256", "--rate", "100/m", "--burst", "10")
		o.mustRun(cli.ExitOK, "limit", "set", "--type", "SHA256", "--rate", "200/m")
		o.mustRun(cli.ExitOK, "limit", "set", "--queue", "low", "--rate", "5/s")
		out, _ := o.mustRun(cli.ExitOK, "limit", "ls", "--json")
		infos := jsonLines[protocol.LimitInfo](t, out)
		if len(infos) != 2 || infos[0].Name != "low" || infos[0].Burst != 1 || infos[1].Name != "SHA256" || infos[1].Rate != "200/m" || infos[1].Burst != 10 {
			t.Fatalf("limit ls --json: %+v, want SHA256 at 200/m keeping its burst of 10, and low's burst 1", infos)
		}
	})
}

// TestLimitUsageErrors: a limit that cannot be set exits 2 with what is wrong.
func TestLimitUsageErrors(t *testing.T) {
	t.Parallel()
	s := setup(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"limit", "set", "--type", "SHA256"}, "limit set needs --rate COUNT/PERIOD"},
		{[]string{"limit", "set", "--rate", "1/s"}, "limit set needs --type TASK_TYPE or --queue NAME"},
		{[]string{"limit", "set", "--type", "SHA256", "--queue", "q", "--rate", "1/s"}, "limit set takes --type or --queue, not both"},
		{[]string{"limit", "set", "--type", "SHA256", "--rate", "0/s"}, "rate count must be positive, got 0"},
		{[]string{"limit", "set", "--type", "SHA256", "--rate", "-3/m"}, "rate count must be positive, got -3"},
		{[]string{"limit", "set", "--type", "SHA256", "--rate", "5/fortnight"}, `unknown unit "fortnight"`},
		{[]string{"limit", "set", "--type", "SHA256", "--rate", "lots"}, "must be COUNT/PERIOD"},
		{[]string{"limit", "set", "--type", "SHA256", "--rate", "1/s", "--burst", "0"}, "--burst must be 1 to 100000, got 0"},
		{[]string{"limit", "set", "--queue", "a b", "--rate", "1/s"}, `queue name "a b" must be`},
		{[]string{"limit", "rm"}, "limit rm needs --type TASK_TYPE or --queue NAME"},
		{[]string{"submit", "SHA256", "--text", "x", "--unique-while", "forever"}, `--unique-while must be "active"`},
		{[]string{"submit", "SHA256", "--text", "x", "--unique-for", "-1s"}, "--unique-for must be positive"},
		{[]string{"submit", "SHA256", "--text", "x", "--unique-for", "721h"}, "--unique-for 721h0m0s is more than 30 days"},
		{[]string{"submit", "SHA256", "--text", "x", "--unique-for", "1h", "--unique-while", "active"}, "--unique-for and --unique-while cannot be combined"},
	}
	for _, tc := range cases {
		code, _, errs := s.run(tc.args...)
		if code != cli.ExitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("jobbus %s: exit %d, stderr %q; want %d and %q", strings.Join(tc.args, " "), code, errs, cli.ExitUsage, tc.want)
		}
	}
	if code, out, _ := s.run("limit", "ls", "--json"); code != cli.ExitOK || out != "" {
		t.Fatalf("after the refusals, limit ls: exit %d %q, want no limit", code, out)
	}
}

// TestSubmitUnique: --unique-for and --unique-while active answer a repeat of the same
// work with the first job's id.
func TestSubmitUnique(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		a, _ := o.mustRun(cli.ExitOK, "submit", "sha256", "--text", "once an hour", "--unique-for", "1h")
		b, _ := o.mustRun(cli.ExitOK, "submit", "SHA256", "--payload", `{"text": "once an hour"}`, "--unique-for", "1h")
		if a != b {
			t.Errorf("unique for an hour: %q then %q", a, b)
		}
		c, _ := o.mustRun(cli.ExitOK, "submit", "SLEEP", "--milliseconds", "600000", "--unique-while", "active")
		d, _ := o.mustRun(cli.ExitOK, "submit", "SLEEP", "--milliseconds", "600000", "--unique-while", "active")
		if c != d {
			t.Errorf("unique while active: %q then %q", c, d)
		}
		o.mustRun(cli.ExitOK, "cancel", strings.TrimSpace(c))
		e, _ := o.mustRun(cli.ExitOK, "submit", "SLEEP", "--milliseconds", "600000", "--unique-while", "active")
		if e == c {
			t.Errorf("unique while active, after it ended: the same job %q", e)
		}
		o.mustRun(cli.ExitOK, "cancel", strings.TrimSpace(e))
	})
}

// TestRateLimitSurvivesLeaderKill: two coordinator processes share a NATS server; the
// leader spends a limit's whole burst and is SIGKILLed. The standby takes over with the
// limit (a durable setting) and an empty bucket: in no 10 s are more than rate + burst
// started, where a standby starting with a full bucket would start a second burst at
// once. Starts are seen by the worker that runs them.
func TestRateLimitSurvivesLeaderKill(t *testing.T) {
	t.Parallel()
	s := startNATS(t)
	coordinatorProc := func() *proc {
		return startProc(t, nil, "--nats", s.url, "coordinator", "--http-listen", "-", "--leader-lease-millis", "1000")
	}
	leader := coordinatorProc()
	leader.logged(`msg="coordinator serving"`)
	standby := coordinatorProc()
	standby.logged(`msg="standing by`)

	var mu sync.Mutex
	var starts []time.Time
	s.StartFunctionWorker(t, func(w *worker.Worker) error {
		return worker.HandleJSON(w, "TICK", func(_ context.Context, _ int, _ struct{ N int }) (string, error) {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			return "tick", nil
		})
	}, worker.WithCapacity(64))
	seen := func() []time.Time { mu.Lock(); defer mu.Unlock(); return slices.Clone(starts) }

	cl := client.New(s.NC, client.WithTimeout(10*time.Second))
	const rate, burst = "5/10s", 10 // 10 at once, then one every 2 s: at most 15 in 10 s
	eventually(t, "the limit set", func() bool {
		_, err := cl.SetLimit(context.Background(), client.ForTaskType("TICK"), rate, burst)
		return err == nil
	})
	eventually(t, "the worker serving TICK", func() bool {
		types, err := cl.TaskTypes(context.Background())
		return err == nil && slices.ContainsFunc(types, func(ty protocol.TaskTypeInfo) bool { return ty.Name == "TICK" && len(ty.Workers) > 0 })
	})
	for i := range 30 {
		if _, err := cl.Submit(context.Background(), "TICK", map[string]int{"N": i}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the leader spent its burst", func() bool { return len(seen()) >= burst })
	leader.signal(syscall.SIGKILL)
	killed := time.Now()
	servingSince(t, standby, killed.Add(-time.Second))
	limits, err := cl.Limits(context.Background())
	if err != nil || len(limits) != 1 || limits[0].Rate != rate || limits[0].Burst != burst {
		t.Fatalf("the new leader's limits: %+v %v, want %s burst %d", limits, err, rate, burst)
	}
	eventually(t, "the new leader starts a job as its first token comes", func() bool { return len(seen()) > burst })
	got := seen()
	slices.SortFunc(got, func(a, b time.Time) int { return a.Compare(b) })
	most := 0
	for i, j := 0, 0; i < len(got); i++ {
		for j < len(got) && got[j].Sub(got[i]) < 10*time.Second {
			j++
		}
		most = max(most, j-i)
	}
	t.Logf("limit %s burst %d, the burst spent, then the leader SIGKILLed: %d starts by %v after the kill, the busiest 10 s holds %d (bound 15)",
		rate, burst, len(got), got[len(got)-1].Sub(killed).Round(time.Millisecond), most)
	if most > 15 {
		t.Fatalf("%d starts within 10 s across the kill: more than rate + burst (15)", most)
	}
}

// TestUniqueSurvivesServeKill: jobbus serve SIGKILLed and run again on its store still
// answers a unique job's repeats with its id: one that completed within its window, and
// one still active; the rate limit set before the kill is still in force.
func TestUniqueSurvivesServeKill(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, url := serveProc(t, dir, "--workers", "1")
	cl := client.New(natsConnect(t, url), client.WithTimeout(10*time.Second))
	ctx := context.Background()
	done, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "once an hour"}, client.UniqueFor(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if j, err := cl.Wait(ctx, done); err != nil || j.State != protocol.StateCompleted {
		t.Fatalf("unique job %+v %v", j, err)
	}
	if _, err := cl.SetLimit(ctx, client.ForTaskType("SLEEP"), "1/h", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 1}); err != nil { // takes the token
		t.Fatal(err)
	}
	active, err := cl.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 2}, client.UniqueWhileActive())
	if err != nil {
		t.Fatal(err)
	}
	p.signal(syscall.SIGKILL)
	p.wait()

	_, url = serveProc(t, dir, "--workers", "1")
	cl = client.New(natsConnect(t, url), client.WithTimeout(10*time.Second))
	if got, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "once an hour"}, client.UniqueFor(time.Hour)); err != nil || got != done {
		t.Fatalf("after the kill, the completed unique job is %s; a repeat got %s %v", done, got, err)
	}
	if got, err := cl.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 2}, client.UniqueWhileActive()); err != nil || got != active {
		t.Fatalf("after the kill, the active unique job is %s; a repeat got %s %v", active, got, err)
	}
	if j, err := cl.Status(ctx, active); err != nil || j.State != protocol.StateQueued {
		t.Fatalf("the job held back by the limit: %+v %v, want QUEUED still", j, err)
	}
	limits, err := cl.Limits(ctx)
	if err != nil || len(limits) != 1 || limits[0].Rate != "1/h" || limits[0].Tokens >= 1 {
		t.Fatalf("limits after the kill: %+v %v, want 1/h with an empty bucket", limits, err)
	}
}
