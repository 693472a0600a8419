package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/worker"
)

// startLog is a coordinator.Observer that keeps the time of every start (a job moving
// to RUNNING) of one task type, across the coordinators that share it.
type startLog struct {
	taskType string
	mu       sync.Mutex
	starts   []time.Time
}

func (o *startLog) Submitted(coordinator.SubmitOutcome)    {}
func (o *startLog) DeadlineExpired(string)                 {}
func (o *startLog) Stored(time.Duration, error, bool, int) {}
func (o *startLog) Synced(time.Duration, int, error)       {}
func (o *startLog) JobChanged(ch coordinator.JobChange) {
	if ch.To != protocol.StateRunning || ch.TaskType != o.taskType {
		return
	}
	o.mu.Lock()
	o.starts = append(o.starts, ch.At)
	o.mu.Unlock()
}

func (o *startLog) times() []time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := slices.Clone(o.starts)
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// busiestWindow is the most starts within any window of length w (from each start),
// and where that window begins.
func busiestWindow(starts []time.Time, w time.Duration) (most int, at time.Time) {
	j := 0
	for i := range starts {
		for j < len(starts) && starts[j].Sub(starts[i]) < w {
			j++
		}
		if j-i > most {
			most, at = j-i, starts[i]
		}
	}
	return most, at
}

// windowBound is the most starts a limit of rate and burst allows in a window w as
// the observer sees it: starts are stamped to the millisecond, so a window of w holds
// starts up to w+1ms apart.
func windowBound(r protocol.Rate, burst int64, w time.Duration) int {
	return int(burst) + int(float64(r.Count)*float64(w+time.Millisecond)/float64(r.Period))
}

// submitBacklog submits n SHA256 jobs of distinct payloads and returns their ids.
func submitBacklog(t *testing.T, cl *client.Client, n int, opts ...client.SubmitOption) []string {
	t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 32)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			id, err := cl.Submit(context.Background(), "SHA256", text(fmt.Sprintf("backlog %d", i)), opts...)
			ids[i] = id
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("submit: %v", err)
	}
	return ids
}

// TestRateLimitBoundsStarts: a rate limit on a task type holds a backlog to its rate:
// no window of one period has more than rate + burst starts, the whole backlog takes
// at least (jobs - burst) / rate, and every job completes (none fails for the limit).
func TestRateLimitBoundsStarts(t *testing.T) {
	t.Parallel()
	obs := &startLog{taskType: "SHA256"}
	s := setup(t, func(c *coordinator.Config) { c.Observer = obs })
	ctx := context.Background()
	const rate, burst, jobs = "10/100ms", 3, 80
	info, err := s.Client.SetLimit(ctx, client.ForTaskType("SHA256"), rate, burst)
	must(t, err)
	if info.Rate != "10/100ms" || info.Burst != burst || info.Tokens != burst || info.PerSecond != 100 {
		t.Fatalf("limit set: %+v, want 10/100ms burst 3, full, 100/s", info)
	}
	ids := submitBacklog(t, s.Client, jobs)
	s.StartWorker(64)
	for _, id := range ids {
		if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 {
			t.Fatalf("job %+v: every job completes on its first attempt, the limit fails none", j)
		}
	}
	starts := obs.times()
	if len(starts) != jobs {
		t.Fatalf("%d starts seen, want %d", len(starts), jobs)
	}
	r, _ := protocol.ParseRate(rate)
	if most, at := busiestWindow(starts, r.Period); most > windowBound(r, burst, r.Period) {
		t.Fatalf("%d starts within %v from %v: more than rate + burst (%d)", most, r.Period, at, windowBound(r, burst, r.Period))
	}
	least := time.Duration(jobs-burst) * r.Period / time.Duration(r.Count)
	if span := starts[len(starts)-1].Sub(starts[0]); span < least-time.Millisecond {
		t.Fatalf("%d starts within %v: the limit of %s with burst %d needs at least %v", jobs, span, rate, burst, least)
	}
	limits, err := s.Client.Limits(ctx)
	must(t, err)
	if len(limits) != 1 || limits[0].Throttled == 0 || limits[0].Throttled > jobs-burst {
		t.Fatalf("limit ls: %+v, want the one limit with 1..%d throttled starts", limits, jobs-burst)
	}
}

// TestRateLimitedJobsWaitQueued: jobs over a limit wait QUEUED, never fail, and start
// as soon as the limit is raised or removed; jobs of other types are not held back.
func TestRateLimitedJobsWaitQueued(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	sha := client.ForTaskType("SHA256")
	_, err := s.Client.SetLimit(ctx, sha, "1/h", 1)
	must(t, err)
	s.StartWorker(4)
	s.Wait(s.Submit("SHA256", text("takes the one token")))
	held := []string{s.Submit("SHA256", text("a")), s.Submit("SHA256", text("b"))}
	other := s.Submit("WORD_COUNT", text("another type is not held back"))
	if j := s.Wait(other); j.State != protocol.StateCompleted {
		t.Fatalf("a job of another type: %+v", j)
	}
	expectQueued := func(when string, ids ...string) {
		t.Helper()
		for _, id := range ids {
			if j := s.Status(id); j.State != protocol.StateQueued || j.Attempts != 0 {
				t.Fatalf("%s: job over the limit %+v, want QUEUED, never started", when, j)
			}
		}
	}
	expectQueued("1/h", held...)
	limits, err := s.Client.Limits(ctx)
	must(t, err)
	if len(limits) != 1 || limits[0].Tokens >= 1 || limits[0].NextTokenMillis < time.Now().Add(50*time.Minute).UnixMilli() {
		t.Fatalf("limit ls: %+v, want an empty bucket whose next token is an hour away", limits)
	}

	// Raised: a token every 100 ms.
	info, err := s.Client.SetLimit(ctx, sha, "10/s", 1)
	must(t, err)
	if info.Tokens >= 1 {
		t.Fatalf("a changed limit keeps its bucket's tokens (none): %+v", info)
	}
	for _, id := range held {
		if j := s.Wait(id); j.State != protocol.StateCompleted {
			t.Fatalf("after the limit was raised: %+v", j)
		}
	}

	// Lowered again once the bucket is full (the token it holds stays), then removed.
	s.Eventually("the bucket is full again", func() bool {
		l, err := s.Client.Limits(ctx)
		return err == nil && len(l) == 1 && l[0].Tokens == 1
	})
	info, err = s.Client.SetLimit(ctx, sha, "1/h", 1)
	must(t, err)
	if info.Tokens != 1 {
		t.Fatalf("lowered: %+v, want the full bucket's token kept", info)
	}
	s.Wait(s.Submit("SHA256", text("takes the token")))
	last := s.Submit("SHA256", text("c"))
	expectQueued("1/h again", last)
	removed, err := s.Client.RemoveLimit(ctx, sha)
	must(t, err)
	if removed.Rate != "1/h" || removed.Scope != "type" || removed.Name != "SHA256" {
		t.Fatalf("removed %+v", removed)
	}
	if j := s.Wait(last); j.State != protocol.StateCompleted {
		t.Fatalf("after the limit was removed: %+v", j)
	}
	if limits, err := s.Client.Limits(ctx); err != nil || len(limits) != 0 {
		t.Fatalf("limit ls after rm: %+v %v", limits, err)
	}
}

// TestRateLimitBadInput: a limit that cannot be enforced is refused with a clear error,
// by the client before sending and by the coordinator for a request sent as is.
func TestRateLimitBadInput(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	cases := []struct {
		req  protocol.SetLimit
		says string
	}{
		{protocol.SetLimit{Scope: "type", Name: "SHA256", Rate: "0/s"}, "Invalid limit: invalid rate limit: rate count must be positive, got 0"},
		{protocol.SetLimit{Scope: "type", Name: "SHA256", Rate: "-5/m"}, "rate count must be positive, got -5"},
		{protocol.SetLimit{Scope: "type", Name: "SHA256", Rate: "100"}, `rate "100" must be COUNT/PERIOD`},
		{protocol.SetLimit{Scope: "type", Name: "SHA256", Rate: "100/fortnight"}, `unknown unit "fortnight"`},
		{protocol.SetLimit{Scope: "type", Name: "SHA256", Rate: "ten/s"}, "is not an integer"},
		{protocol.SetLimit{Scope: "type", Name: "SHA256", Rate: "1/s", Burst: -1}, "burst must be 1 to 100000, got -1"},
		{protocol.SetLimit{Scope: "worker", Name: "SHA256", Rate: "1/s"}, `scope must be "type" or "queue", got "worker"`},
		{protocol.SetLimit{Scope: "queue", Name: "has space", Rate: "1/s"}, `queue name "has space" must be`},
	}
	for _, c := range cases {
		_, err := s.Client.SetLimit(ctx, client.LimitTarget{Scope: c.req.Scope, Name: c.req.Name}, c.req.Rate, c.req.Burst)
		if !errors.Is(err, protocol.ErrBadLimit) || !strings.Contains(err.Error(), strings.TrimPrefix(c.says, "Invalid limit: ")) {
			t.Errorf("client SetLimit(%+v) = %v, want ErrBadLimit saying %q", c.req, err, c.says)
		}
		m, err := s.Client.Do(ctx, &c.req)
		if err != nil {
			t.Fatalf("send %+v: %v", c.req, err)
		}
		e, ok := m.(*protocol.Error)
		if !ok || !strings.HasPrefix(e.Message, "Invalid limit: ") || !strings.Contains(e.Message, strings.TrimPrefix(c.says, "Invalid limit: ")) {
			t.Errorf("coordinator answered %+v to %+v, want an ERROR saying %q", m, c.req, c.says)
		}
	}
	_, err := s.Client.RemoveLimit(ctx, client.ForQueue("nothing-set"))
	var se *client.ServerError
	if !errors.As(err, &se) || se.Message != "Unknown limit: queue nothing-set" {
		t.Fatalf("remove of a limit not set: %v", err)
	}
	if limits, err := s.Client.Limits(ctx); err != nil || len(limits) != 0 {
		t.Fatalf("after bad input, limits %+v %v: nothing was set", limits, err)
	}
}

// TestRateLimitRateChangeKeepsTheBurst: a change of the rate alone (SetLimitRate,
// `jobbus limit set` without --burst) keeps the burst the coordinator holds as it
// writes, so a burst another operator set since is kept. The CLI read the burst and
// sent it back with the new rate: a burst set between its read and its write was
// overwritten with the one it read.
func TestRateLimitRateChangeKeepsTheBurst(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	target := client.ForTaskType("SHA256")
	_, err := s.Client.SetLimit(ctx, target, "10/s", 5) // what one operator's CLI read
	must(t, err)
	_, err = s.Client.SetLimit(ctx, target, "10/s", 20) // another's, meanwhile
	must(t, err)
	info, err := s.Client.SetLimitRate(ctx, target, "20/s")
	must(t, err)
	if info.Rate != "20/s" || info.Burst != 20 {
		t.Fatalf("rate changed alone: %+v, want 20/s with the burst 20 set last", info)
	}
	info, err = s.Client.SetLimitRate(ctx, client.ForQueue("fresh"), "1/s")
	must(t, err)
	if info.Burst != 1 {
		t.Fatalf("a new limit set by its rate alone: %+v, want burst 1", info)
	}
}

// TestRateLimitSurvivesFailover runs two campaigning coordinators on one server. The
// leader spends its whole burst at once and is stopped: the standby takes over with
// the limit (a durable setting) and an empty bucket, so the two leaders together start
// no more than rate + burst in any period. A standby that started with a full bucket
// would start a second burst within the period, which this test would see.
func TestRateLimitSurvivesFailover(t *testing.T) {
	t.Parallel()
	obs := &startLog{taskType: "SHA256"}
	s := setup(t, func(c *coordinator.Config) { c.Observer = obs })
	ctx := context.Background()
	_ = s.Coordinator.Close() // the campaigners below replace the plain coordinator
	cfg := s.Config
	cfg.LeaderLease = 600 * time.Millisecond
	run, leads := campaigners(t, s, cfg) // leader_test.go
	led := func(n int) bool { return leads(n) > 0 }
	stop1 := run(1)
	s.Eventually("coordinator 1 leads", func() bool { return led(1) })
	run(2)
	// 10 at once, then one every 2 s: in any 10 s, at most 15.
	const rate, burst = "5/10s", 10
	_, err := s.Client.SetLimit(ctx, client.ForTaskType("SHA256"), rate, burst)
	must(t, err)
	submitBacklog(t, s.Client, 30)
	s.StartWorker(64)
	s.Eventually("the leader spent its burst", func() bool { return len(obs.times()) >= burst })
	stop1()
	failedOver := time.Now()
	s.Eventually("coordinator 2 leads", func() bool { return led(2) })
	limits, err := s.Client.Limits(ctx)
	must(t, err)
	if len(limits) != 1 || limits[0].Rate != rate || limits[0].Burst != burst || limits[0].Tokens >= 1 {
		t.Fatalf("the new leader's limits: %+v, want %s burst %d, its bucket empty", limits, rate, burst)
	}
	s.Eventually("the new leader starts a job as its first token comes", func() bool { return len(obs.times()) > burst })
	starts := obs.times()
	r, _ := protocol.ParseRate(rate)
	most, at := busiestWindow(starts, r.Period)
	t.Logf("limit %s burst %d, the burst spent, then a failover: %d starts by %v after it, the busiest %v holds %d, bound %d",
		rate, burst, len(starts), starts[len(starts)-1].Sub(failedOver).Round(time.Millisecond), r.Period, most, windowBound(r, burst, r.Period))
	if most > windowBound(r, burst, r.Period) {
		t.Fatalf("%d starts within %v from %v (failover at %v): more than rate + burst (%d)", most, r.Period, at, failedOver, windowBound(r, burst, r.Period))
	}
}

// TestRateLimitHeldForAMinute (long: JOBBUS_LONG_TESTS=1, task test-limits) holds a
// backlog to 100/s with burst 10 for 60 s: 6,010 starts +- 1%, and no second with more
// than 110.
func TestRateLimitHeldForAMinute(t *testing.T) {
	if os.Getenv("JOBBUS_LONG_TESTS") == "" {
		t.Skip("long: set JOBBUS_LONG_TESTS=1 (task test-limits)")
	}
	obs := &startLog{taskType: "SHA256"}
	s := setup(t, func(c *coordinator.Config) { c.Observer = obs })
	ctx := context.Background()
	const rate, burst, jobs = "100/s", 10, 6600
	_, err := s.Client.SetLimit(ctx, client.ForTaskType("SHA256"), rate, burst)
	must(t, err)
	submitBacklog(t, s.Client, jobs)
	// Workers with room to spare: the limit, not a worker's free slots, holds starts back.
	s.StartWorker(512)
	s.Eventually("the first start", func() bool { return len(obs.times()) > 0 })
	first := obs.times()[0]
	// A start stamped a minute after the first closes the minute.
	var starts []time.Time
	for deadline := time.Now().Add(90 * time.Second); ; {
		starts = obs.times()
		if starts[len(starts)-1].Sub(first) >= time.Minute {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d starts, the last %v after the first: the limit held more than 100/s back", len(starts), starts[len(starts)-1].Sub(first))
		}
		time.Sleep(100 * time.Millisecond)
	}
	var inMinute []time.Time
	for _, at := range starts {
		if at.Sub(first) < time.Minute {
			inMinute = append(inMinute, at)
		}
	}
	r, _ := protocol.ParseRate(rate)
	want := 6000 + burst
	most, at := busiestWindow(inMinute, time.Second)
	// A bucket full for longer than it takes to fill drops what it would gain: starts
	// lost to a coordinator that started nothing for more than burst/rate (a stall of
	// the process on a loaded machine), which no limit can give back.
	var stalled int
	var stalls []string
	fill := time.Duration(burst) * r.Period / time.Duration(r.Count)
	for i := 1; i < len(inMinute); i++ {
		if gap := inMinute[i].Sub(inMinute[i-1]); gap > fill {
			stalled += int((gap - fill) * time.Duration(r.Count) / r.Period)
			stalls = append(stalls, fmt.Sprintf("%v at +%v", gap, inMinute[i-1].Sub(first).Round(time.Millisecond)))
		}
	}
	t.Logf("limit %s burst %d: %d starts in the first 60 s (want %d +- 1%%), busiest second %d (from +%v), bound %d; about %d lost to %d stalls over %v: %v",
		rate, burst, len(inMinute), want, most, at.Sub(first), windowBound(r, burst, time.Second), stalled, len(stalls), fill, stalls)
	if n := len(inMinute); n < want*99/100 || n > want*101/100 {
		t.Fatalf("%d starts in 60 s, want %d +- 1%%", n, want)
	}
	if most > windowBound(r, burst, time.Second) {
		t.Fatalf("%d starts within one second from +%v: more than rate + burst", most, at.Sub(first))
	}
}

// TestQueueRateLimit: a limit on a queue holds back the jobs of every task type in it,
// together: one token for both types.
func TestQueueRateLimit(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	_, err := s.Client.SetLimit(ctx, client.ForQueue("default"), "1/h", 1)
	must(t, err)
	s.StartWorker(4)
	first := s.Submit("SHA256", text("takes the queue's token"))
	s.Wait(first)
	held := s.Submit("WORD_COUNT", text("another type, the same queue"))
	// A free worker runs WORD_COUNT: without the limit it would start at once. A window
	// to see it not start in, not a synchronisation.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if j := s.Status(held); j.State != protocol.StateQueued {
			t.Fatalf("a job of the limited queue: %+v, want QUEUED", j)
		}
	}
	limits, err := s.Client.Limits(ctx)
	must(t, err)
	if len(limits) != 1 || limits[0].Scope != protocol.LimitQueue || limits[0].Name != "default" || limits[0].Tokens >= 1 {
		t.Fatalf("limit ls: %+v, want the default queue's, its token taken", limits)
	}
	_, err = s.Client.RemoveLimit(ctx, client.ForQueue("default"))
	must(t, err)
	if j := s.Wait(held); j.State != protocol.StateCompleted {
		t.Fatalf("after the queue's limit was removed: %+v", j)
	}
}

// TestQueueRateLimitHoldsItsQueueOnly: a limit on one queue holds back that queue's
// jobs and no other's, for the same task type.
func TestQueueRateLimitHoldsItsQueueOnly(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	_, err := s.Client.SetLimit(ctx, client.ForQueue("low"), "1/h", 1)
	must(t, err)
	s.StartNativeWorker(t, worker.WithCapacity(4),
		worker.WithQueues(protocol.QueueWeight{Name: "default", Weight: 1}, protocol.QueueWeight{Name: "low", Weight: 1}))
	s.Wait(s.Submit("SHA256", text("takes low's token"), client.Queue("low")))
	held := s.Submit("SHA256", text("waits in low"), client.Queue("low"))
	other := s.Submit("SHA256", text("the default queue is not held back"))
	if j := s.Wait(other); j.State != protocol.StateCompleted {
		t.Fatalf("a job of another queue: %+v", j)
	}
	if j := s.Status(held); j.State != protocol.StateQueued || j.Queue != "low" {
		t.Fatalf("a job over its queue's limit: %+v, want QUEUED in low", j)
	}
	_, err = s.Client.RemoveLimit(ctx, client.ForQueue("low"))
	must(t, err)
	if j := s.Wait(held); j.State != protocol.StateCompleted {
		t.Fatalf("after low's limit was removed: %+v", j)
	}
}

// TestRecoveryReadsEachSettingOnce: a recovering coordinator reads its settings (here
// queues' and limits') from one listing of the jobs stream, their values with it; it
// does not read each setting again, one request after another.
func TestRecoveryReadsEachSettingOnce(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	const n = 5
	for i := range n {
		q := fmt.Sprintf("q%d", i)
		_, err := s.Client.SetQueue(ctx, q, client.MaxRunning(i+1))
		must(t, err)
		_, err = s.Client.SetLimit(ctx, client.ForQueue(q), "1/s", 1)
		must(t, err)
	}
	var reads atomic.Int32
	sub, err := s.NC.Subscribe("$JS.API.DIRECT.GET.KV_"+protocol.JobsBucket+".$KV."+protocol.JobsBucket+"."+protocol.ControlPrefix+">",
		func(m *nats.Msg) {
			if !strings.HasSuffix(m.Subject, ">") { // not a listing's check that it read to the end
				reads.Add(1)
			}
		})
	must(t, err)
	defer sub.Unsubscribe()
	must(t, s.NC.Flush())

	s.RestartCoordinator(t)
	qs, err := s.Client.Queues(ctx)
	must(t, err)
	ls, err := s.Client.Limits(ctx)
	must(t, err)
	for i := range n {
		q := fmt.Sprintf("q%d", i)
		if !slices.ContainsFunc(qs, func(qi protocol.QueueInfo) bool { return qi.Name == q && qi.MaxRunning == i+1 }) {
			t.Fatalf("queue %s not recovered: %+v", q, qs)
		}
		if !slices.ContainsFunc(ls, func(l protocol.LimitInfo) bool { return l.Name == q }) {
			t.Fatalf("limit of %s not recovered: %+v", q, ls)
		}
	}
	if got := reads.Load(); got != 0 {
		t.Errorf("recovery read single settings %d times; want none: the listing has them (%d settings)", got, 2*n)
	}
}
