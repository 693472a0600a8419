package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/embeddednats"
)

func TestEffectivePriority(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1_000_000_000)
	step := time.Minute
	cases := []struct {
		base   protocol.Priority
		waited time.Duration
		want   int
	}{
		{protocol.PriorityLow, 0, 0},
		{protocol.PriorityLow, 59 * time.Second, 0},
		{protocol.PriorityLow, time.Minute, 1},
		{protocol.PriorityLow, 119 * time.Second, 1},
		{protocol.PriorityLow, 2 * time.Minute, 2},
		{protocol.PriorityLow, 10 * time.Hour, 2},
		{protocol.PriorityNormal, 0, 1},
		{protocol.PriorityNormal, time.Minute, 2},
		{protocol.PriorityNormal, time.Hour, 2},
		{protocol.PriorityHigh, 0, 2},
		{protocol.PriorityHigh, time.Hour, 2},
		{protocol.PriorityNormal, -time.Minute, 1}, // a clock that went back ages nothing
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s_%v", tc.base, tc.waited), func(t *testing.T) {
			created := now.Add(-tc.waited).UnixMilli()
			if got := effectivePriority(tc.base, created, now, step); got != tc.want {
				t.Fatalf("effective priority %d, want %d", got, tc.want)
			}
		})
	}
}

// TestEffectivePrioritySubMillisecondStep: Config.Validate takes any positive aging
// step, and a step under a millisecond ages a job by whole steps too, instead of
// dividing by its zero milliseconds (a panic of the scheduler).
func TestEffectivePrioritySubMillisecondStep(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1_000_000_000)
	for _, tc := range []struct {
		step   time.Duration
		waited time.Duration
		want   int
	}{
		{500 * time.Microsecond, 0, 0},
		{500 * time.Microsecond, time.Millisecond, 2},
		{700 * time.Microsecond, time.Millisecond, 1},
		{time.Nanosecond, time.Hour, 2},
	} {
		cfg := DefaultConfig()
		cfg.AgingStep = tc.step
		if err := cfg.Validate(); err != nil {
			t.Fatalf("aging step %v: %v", tc.step, err)
		}
		if got := effectivePriority(protocol.PriorityLow, now.Add(-tc.waited).UnixMilli(), now, tc.step); got != tc.want {
			t.Errorf("LOW after %v, step %v: effective priority %d, want %d", tc.waited, tc.step, got, tc.want)
		}
	}
}

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	want := map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 5: 16 * time.Second, 6: 30 * time.Second, 1000: 30 * time.Second}
	for attempts, d := range want {
		if got := cfg.retryDelay(attempts); got != d {
			t.Errorf("retryDelay(%d) = %v, want %v", attempts, got, d)
		}
	}
}

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.MaxAttempts, cfg.MaxActiveJobs, cfg.SweepInterval = 0, 0, 0
	err := cfg.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"max attempts", "max active jobs", "sweep interval"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func TestFingerprintIsStructural(t *testing.T) {
	t.Parallel()
	fp := func(task, payload string, max int, p protocol.Priority) string {
		t.Helper()
		f, err := fingerprint(task, json.RawMessage(payload), max, p)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	base := fp("SHA256", `{"text":"a","n":[1,2]}`, 3, protocol.PriorityNormal)
	if fp("SHA256", ` { "n" : [1, 2], "text":"a" }`, 3, protocol.PriorityNormal) != base {
		t.Error("key order or spacing changed the fingerprint")
	}
	for name, other := range map[string]string{
		"task":     fp("WORD_COUNT", `{"text":"a","n":[1,2]}`, 3, protocol.PriorityNormal),
		"payload":  fp("SHA256", `{"text":"a","n":[2,1]}`, 3, protocol.PriorityNormal),
		"attempts": fp("SHA256", `{"text":"a","n":[1,2]}`, 2, protocol.PriorityNormal),
		"priority": fp("SHA256", `{"text":"a","n":[1,2]}`, 3, protocol.PriorityLow),
	} {
		if other == base {
			t.Errorf("a different %s gave the same fingerprint", name)
		}
	}
}

// queuedJob makes a QUEUED job for queue tests.
func queuedJob(seq uint64, p protocol.Priority, createdAt int64, task string) *job {
	return &job{rec: protocol.Record{JobID: fmt.Sprint(seq), Seq: seq, Priority: p, CreatedAt: createdAt, TaskType: task, State: protocol.StateQueued}}
}

// best returns the job to run next among the task types runnable accepts, as dispatch
// chooses within one queue (dispatch.go's offer, without workers and limits).
func (r *readyQueue) best(now time.Time, aging time.Duration, runnable func(taskType string) bool) *job {
	var best *job
	bestEff := -1
	for _, q := range r.queues {
		for taskType, tl := range q.byType {
			if !runnable(taskType) {
				continue
			}
			kl := tl.front(0)
			if kl == nil {
				continue
			}
			j, eff := kl.best(now, aging)
			if j != nil && (eff > bestEff || (eff == bestEff && waitedLonger(j, best))) {
				best, bestEff = j, eff
			}
		}
	}
	return best
}

func TestReadyQueueOrder(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(10 * 60_000)
	all := func(string) bool { return true }
	q := newReadyQueue()
	jobs := []*job{
		queuedJob(1, protocol.PriorityLow, now.Add(-2*time.Minute).UnixMilli(), "A"),     // aged to HIGH
		queuedJob(2, protocol.PriorityNormal, now.Add(-30*time.Second).UnixMilli(), "B"), // NORMAL
		queuedJob(3, protocol.PriorityHigh, now.UnixMilli(), "A"),                        // HIGH
		queuedJob(4, protocol.PriorityLow, now.UnixMilli(), "B"),                         // LOW
		queuedJob(5, protocol.PriorityNormal, now.UnixMilli(), "A"),                      // NORMAL
	}
	for _, j := range []int{4, 2, 0, 3, 1} { // pushed out of order
		q.push(jobs[j])
	}
	var got []uint64
	for q.size > 0 {
		j := q.best(now, time.Minute, all)
		q.pop(j)
		got = append(got, j.rec.Seq)
	}
	if fmt.Sprint(got) != "[1 3 2 5 4]" {
		t.Fatalf("order %v, want [1 3 2 5 4]", got)
	}
}

func TestReadyQueueSkipsWhatNoWorkerRunsAndStaleEntries(t *testing.T) {
	t.Parallel()
	now := time.Now()
	q := newReadyQueue()
	a, b, c := queuedJob(1, protocol.PriorityHigh, now.UnixMilli(), "CUSTOM"), queuedJob(2, protocol.PriorityLow, now.UnixMilli(), "SHA256"), queuedJob(3, protocol.PriorityLow, now.UnixMilli(), "SHA256")
	q.push(a)
	q.push(b)
	q.push(c)
	b.rec.State = protocol.StateCancelled
	q.forget(b)
	onlySHA := func(task string) bool { return task == "SHA256" }
	if j := q.best(now, time.Minute, onlySHA); j != c {
		t.Fatalf("best = %v, want job 3 (job 1's type has no worker, job 2 was cancelled)", j)
	}
	if q.size != 2 {
		t.Fatalf("size %d, want 2", q.size)
	}
	q.forget(b) // forgetting twice changes nothing
	if q.size != 2 {
		t.Fatalf("size %d after a second forget, want 2", q.size)
	}
}

// BenchmarkAssignFromQueue pops the best job from a queue of n waiting jobs of mixed
// priorities and pushes a new one, so the queue stays at n: the cost per assignment
// grows with log n.
//
//	go test -run '^$' -bench AssignFromQueue ./coordinator/
func BenchmarkAssignFromQueue(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			now := time.Now()
			prios := []protocol.Priority{protocol.PriorityLow, protocol.PriorityNormal, protocol.PriorityHigh}
			tasks := []string{"SLEEP", "WORD_COUNT", "SHA256", "PRIME_COUNT", "FAIL"}
			rng := rand.New(rand.NewPCG(1, 2))
			q := newReadyQueue()
			seq := uint64(0)
			add := func() {
				seq++
				q.push(queuedJob(seq, prios[rng.IntN(3)], now.UnixMilli()-int64(rng.IntN(120_000)), tasks[rng.IntN(5)]))
			}
			for range n {
				add()
			}
			all := func(string) bool { return true }
			b.ResetTimer()
			for range b.N {
				j := q.best(now, time.Minute, all)
				q.pop(j)
				j.rec.State = protocol.StateRunning
				add()
			}
		})
	}
}

func TestMinSnapshotSizeIsALowerBound(t *testing.T) {
	t.Parallel()
	w, r, e := "worker-1", strings.Repeat("é\"<", 50), "boom \n"
	for _, s := range []protocol.Job{
		{},
		{JobID: newID(), TaskType: "SHA256", State: protocol.StateQueued, Priority: protocol.PriorityNormal},
		{JobID: newID(), TaskType: "SLEEP", State: protocol.StateRunning, WorkerID: &w, Result: &r, Error: &e, Attempts: 3, MaxAttempts: 3, CreatedAtMillis: 1, UpdatedAtMillis: 2},
	} {
		if least, size := minSnapshotSize(&s), snapshotSize(&s); least > size {
			t.Errorf("lower bound %d exceeds the encoded size %d of %+v", least, size, s)
		}
	}
}

// TestFencedWhileStartingDoesNotServe: a coordinator fenced before it serves (a writer
// of recovery lost a CAS) must not go on to serve: Start fails and nothing answers.
func TestFencedWhileStartingDoesNotServe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := embeddednats.Start(ctx, embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(ctx) })
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := New(nc, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	c.sched.fence(fmt.Errorf("%w (as a recovery write would find it)", ErrFenced))
	if err := c.Start(ctx); !errors.Is(err, ErrFenced) {
		t.Fatalf("Start = %v, want ErrFenced", err)
	}
	if _, err := nc.Request(protocol.APIPrefix+".status", []byte(`{"type":"GET_JOB_STATUS","jobId":"x"}`), 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("status request to a fenced coordinator: %v, want no responders", err)
	}
}
