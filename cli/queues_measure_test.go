package cli_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
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
