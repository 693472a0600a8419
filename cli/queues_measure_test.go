package cli_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
)

// TestKeyFairnessMeasured is the fairness measurement: key A has a backlog
// (5,000 jobs; 50,000 with JOBBUS_LONG_TESTS=1), then key B submits one job at a time,
// five times: each of B's jobs must start within 2x the mean job duration (the issue's
// bar; rotation among keys promises one slot's time). Jobs are 200 ms SLEEPs on one
// worker of 8 slots, so a slot frees every 25 ms on average, and A's backlog alone
// would take minutes.
func TestKeyFairnessMeasured(t *testing.T) {
	t.Parallel()
	backlog := 5_000
	if longTests() {
		backlog = 50_000
	}
	const jobMillis, slots = 200, 8
	s := jobbustest.Start(t, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) {
		c.MaxActiveJobs = backlog + 100
		c.HeartbeatTimeout = 10 * time.Second // a loaded machine must not lose the worker
		c.TaskTimeout = time.Minute
	}))
	cl := client.New(s.NC)
	ctx := context.Background()
	sleep := map[string]int{"durationMillis": jobMillis}

	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for next.Add(1) <= int64(backlog) {
				if _, err := cl.Submit(ctx, "SLEEP", sleep, client.ConcurrencyKey("A")); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	w, _ := s.StartNativeWorker(t, worker.WithCapacity(slots), worker.WithHeartbeat(time.Second))
	eventually(t, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	eventually(t, "the worker full", func() bool { return w.Running() == slots })

	var delays []time.Duration
	for i := range 5 {
		id, err := cl.Submit(ctx, "SLEEP", sleep, client.ConcurrencyKey(fmt.Sprint("B", i)))
		if err != nil {
			t.Fatal(err)
		}
		var j protocol.Job
		eventually(t, "B's job started", func() bool {
			j, err = cl.Status(ctx, id)
			return err == nil && j.State != protocol.StateQueued
		})
		if j.State != protocol.StateRunning {
			t.Fatalf("B's job %s: %s, want RUNNING (seen too late to time its start)", id, j.State)
		}
		delays = append(delays, time.Duration(j.UpdatedAtMillis-j.CreatedAtMillis)*time.Millisecond)
	}
	qs, err := cl.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(delays)
	t.Logf("key A backlog %d (queue: %+v); key B's start delays %v: median %v, max %v; job duration %d ms on %d slots",
		backlog, qs, delays, delays[len(delays)/2], delays[len(delays)-1], jobMillis, slots)
	if max := delays[len(delays)-1]; max > 2*jobMillis*time.Millisecond {
		t.Errorf("B's job waited %v, more than 2x the job duration (%d ms)", max, jobMillis)
	}
}

// TestQueueWeightsMeasured is the weights measurement: queues critical, default
// and low, weighted 6:3:1 by every worker and all full (each holds more than its share
// of the starts), on a real system with two workers of 8 slots: of the first 1,000
// starts (10,000 with JOBBUS_LONG_TESTS=1), each queue's share is within 2 points of
// 60/30/10. A worker's handler notes each start's queue, in order.
func TestQueueWeightsMeasured(t *testing.T) {
	t.Parallel()
	starts := 1_000
	if longTests() {
		starts = 10_000
	}
	weights := map[string]float64{"critical": 0.6, "default": 0.3, "low": 0.1}
	total := 0
	for _, share := range weights {
		total += int(share*float64(starts)) + starts/10 // full to the end
	}
	s := jobbustest.Start(t, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) {
		c.MaxActiveJobs = total + 100
		c.HeartbeatTimeout = 10 * time.Second
	}))
	cl := client.New(s.NC)
	ctx := context.Background()
	type args struct {
		Queue string `json:"queue"`
	}
	var mu sync.Mutex
	var order []string
	note := func(w *worker.Worker) error {
		return worker.HandleJSON(w, "NOTE_QUEUE", func(_ context.Context, _ int, a args) (string, error) {
			mu.Lock()
			order = append(order, a.Queue)
			mu.Unlock()
			return "", nil
		})
	}
	// The type must be known before its jobs: a worker serving another queue declares it.
	decl, stopDecl := s.StartFunctionWorker(t, note, worker.WithQueues(protocol.QueueWeight{Name: "elsewhere", Weight: 1}))
	eventually(t, "the declaring worker listed", func() bool { return jobbustest.WorkerListed(cl, decl.ID()) })
	stopDecl()
	for q, share := range weights { // submitted before any worker: all full
		var wg sync.WaitGroup
		var next atomic.Int64
		n := int64(share*float64(starts)) + int64(starts/10)
		for range 16 {
			wg.Go(func() {
				for next.Add(1) <= n {
					if _, err := cl.Submit(ctx, "NOTE_QUEUE", args{q}, client.Queue(q)); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	for range 2 {
		w, _ := s.StartFunctionWorker(t, note, worker.WithCapacity(8), worker.WithHeartbeat(time.Second),
			worker.WithQueues(protocol.QueueWeight{Name: "critical", Weight: 6}, protocol.QueueWeight{Name: "default", Weight: 3}, protocol.QueueWeight{Name: "low", Weight: 1}))
		eventually(t, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	}
	testkit.Eventually(t, 5*time.Minute, "the starts", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) >= starts
	})
	mu.Lock()
	got := map[string]int{}
	for _, q := range order[:starts] {
		got[q]++
	}
	mu.Unlock()
	t.Logf("of the first %d starts: %v", starts, got)
	for q, share := range weights {
		if d := math.Abs(float64(got[q])/float64(starts) - share); d > 0.02 {
			t.Errorf("queue %s: %d of %d starts, want %.0f%% within 2 points", q, got[q], starts, share*100)
		}
	}
}
