package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/tasktype"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestLongestSleepWithinTheDefaultTimeout: the longest SLEEP PROTOCOL.md allows
// (600000 ms) completes on its one attempt under the default task timeout, scaled here
// to a SLEEP of 300 ms: the coordinator's clock, which the test moves, passes the
// sleep's duration and a millisecond for its result to come back, and the attempt's
// deadline has not come. Before, the default timeout was the longest SLEEP itself, so
// by then it had passed: the sweeper failed the job (execution deadline exceeded) as
// its result came in, and whether a maximal SLEEP completed was down to whether a sweep
// ran in the milliseconds before its result arrived.
func TestLongestSleepWithinTheDefaultTimeout(t *testing.T) {
	t.Parallel()
	const sleep = 300 * time.Millisecond
	longest := time.Duration(tasktype.MaxSleepMillis) * time.Millisecond
	timeout := time.Duration(float64(coordinator.DefaultConfig().TaskTimeout) / float64(longest) * float64(sleep))
	clk := jobbustest.NewClock(time.Now())
	sys := jobbustest.Start(t, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) { c.Now, c.TaskTimeout = clk.Now, timeout }))
	w, _ := sys.StartNativeWorker(t)
	cl := client.New(sys.NC)
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	id, err := cl.Submit(context.Background(), "SLEEP", json.RawMessage(fmt.Sprintf(`{"durationMillis":%d}`, sleep.Milliseconds())), client.MaxAttempts(1))
	must(t, err)
	status := func() protocol.Job {
		j, err := cl.Status(context.Background(), id)
		must(t, err)
		return j
	}
	testkit.Eventually(t, 15*time.Second, "job running", func() bool { return status().State == protocol.StateRunning })
	clk.Advance(sleep + time.Millisecond)
	var j protocol.Job
	testkit.Eventually(t, 15*time.Second, "job ended", func() bool { j = status(); return j.State.Terminal() })
	if j.State != protocol.StateCompleted || j.Attempts != 1 {
		t.Fatalf("SLEEP %v under a task timeout of %v (the default's share): %s after %d attempts, error %q; want COMPLETED after 1",
			sleep, timeout, j.State, j.Attempts, deref(j.Error))
	}
}
