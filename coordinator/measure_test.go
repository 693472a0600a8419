package coordinator_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/worker"
)

// completions counts jobs that reached COMPLETED (a coordinator.Observer).
type completions struct{ n atomic.Int64 }

func (c *completions) Submitted(coordinator.SubmitOutcome) {}
func (c *completions) JobChanged(ch coordinator.JobChange) {
	if ch.To == protocol.StateCompleted {
		c.n.Add(1)
	}
}
func (c *completions) DeadlineExpired(string)                 {}
func (c *completions) Stored(time.Duration, error, bool, int) {}
func (c *completions) Synced(time.Duration, int, error)       {}

// TestMeasureFanOut is issue 26's overhead measure (JOBBUS_MEASURE=1): a 1,000-way
// fan-out with a fan-in step (1,001 jobs) submitted as one workflow, against 1,001
// independent jobs submitted by 16 clients at once; the time from the first
// submission to the last completion, alternated in one sitting, median of N rounds.
func TestMeasureFanOut(t *testing.T) {
	if os.Getenv("JOBBUS_MEASURE") == "" {
		t.Skip("a measurement: JOBBUS_MEASURE=1")
	}
	const fan, rounds = 1000, 11
	done := &completions{}
	s := setup(t, func(c *coordinator.Config) { c.Observer = done; c.MaxActiveJobs = 50_000 })
	for range 2 {
		s.StartNativeWorker(t, worker.WithCapacity(64))
	}
	ctx := context.Background()
	waitFor := func(target int64) {
		deadline := time.Now().Add(2 * time.Minute)
		for done.n.Load() < target {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d completed", done.n.Load(), target)
			}
			time.Sleep(time.Millisecond)
		}
	}
	workflow := func(round int) time.Duration {
		target := done.n.Load() + fan + 1
		w := client.NewWorkflow(fmt.Sprintf("fan-%d", round))
		var names []string
		for i := range fan {
			names = append(names, fmt.Sprintf("p%d", i))
			w.Step(names[i], "SHA256", map[string]string{"text": fmt.Sprint(i)})
		}
		w.Step("join", "SHA256", map[string]string{"text": "join"}, client.StepAfter(names...))
		start := time.Now()
		if _, err := s.Client.SubmitWorkflow(ctx, w); err != nil {
			t.Fatal(err)
		}
		waitFor(target)
		return time.Since(start)
	}
	independent := func(int) time.Duration {
		target := done.n.Load() + fan + 1
		start := time.Now()
		var wg sync.WaitGroup
		next := atomic.Int64{}
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := next.Add(1); i <= fan+1; i = next.Add(1) {
					if _, err := s.Client.Submit(ctx, "SHA256", map[string]string{"text": fmt.Sprint(i)}); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		waitFor(target)
		return time.Since(start)
	}
	workflow(-1) // warm up both paths
	independent(-1)
	var wf, ind []time.Duration
	for r := range rounds {
		if r%2 == 0 {
			wf = append(wf, workflow(r))
			ind = append(ind, independent(r))
		} else {
			ind = append(ind, independent(r))
			wf = append(wf, workflow(r))
		}
	}
	slices.Sort(wf)
	slices.Sort(ind)
	mw, mi := wf[rounds/2], ind[rounds/2]
	t.Logf("1,000-way fan-out + fan-in in one request: median %v; 1,001 independent jobs (16 clients): median %v; workflow/independent %.2f; rounds %v / %v",
		mw.Round(time.Millisecond), mi.Round(time.Millisecond), float64(mw)/float64(mi), wf, ind)
}
