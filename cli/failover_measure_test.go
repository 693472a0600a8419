package cli_test

import (
	"context"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/worker"
)

// TestMeasureFailover measures, with real processes and default timings, how long a
// leader SIGKILL costs: from the kill to the first accepted submission and to the first
// completed job, over several trials. A measurement, not a check (timings are not
// asserted on a shared machine): it runs only with JOBBUS_MEASURE=1 (task measure-failover).
func TestMeasureFailover(t *testing.T) {
	if os.Getenv("JOBBUS_MEASURE") == "" {
		t.Skip("a measurement: set JOBBUS_MEASURE=1")
	}
	const trials = 5
	var toSubmit, toComplete []time.Duration
	for trial := range trials {
		s := startNATS(t)
		leader, standby := s.leaderAndStandby()
		s.StartNativeWorker(t, worker.WithCapacity(4))
		cl := client.New(s.NC)
		if _, err := cl.Submit(context.Background(), "SHA256", map[string]string{"text": "warm"}); err != nil {
			t.Fatal(err)
		}

		killed := time.Now()
		leader.signal(syscall.SIGKILL)
		var id string
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			got, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "after"})
			cancel()
			if err == nil {
				id = got
				break
			}
			if time.Since(killed) > 30*time.Second {
				t.Fatalf("trial %d: no submission accepted within 30 s: %v", trial, err)
			}
		}
		submitted := time.Since(killed)
		for {
			j, err := cl.Status(context.Background(), id)
			if err == nil && j.State == protocol.StateCompleted {
				break
			}
			if time.Since(killed) > 30*time.Second {
				t.Fatalf("trial %d: job not completed within 30 s: %+v %v", trial, j, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		completed := time.Since(killed)
		toSubmit, toComplete = append(toSubmit, submitted), append(toComplete, completed)
		t.Logf("trial %d: first accepted submit %v, first completion %v after the SIGKILL", trial, submitted.Round(time.Millisecond), completed.Round(time.Millisecond))
		standby.signal(syscall.SIGKILL)
	}
	slices.Sort(toSubmit)
	slices.Sort(toComplete)
	t.Logf("leader SIGKILL, %d trials: first accepted submit median %v (%v..%v), first completion median %v (%v..%v)",
		trials, toSubmit[trials/2].Round(time.Millisecond), toSubmit[0].Round(time.Millisecond), toSubmit[trials-1].Round(time.Millisecond),
		toComplete[trials/2].Round(time.Millisecond), toComplete[0].Round(time.Millisecond), toComplete[trials-1].Round(time.Millisecond))
}
