package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
)

// drainSetup is a real system with one native worker and a client.
func drainSetup(t *testing.T) (*jobbustest.System, *client.Client, string, func(), func(context.Context) error) {
	t.Helper()
	sys := jobbustest.Start(t)
	cl := client.New(sys.NC)
	w, stop := sys.StartNativeWorker(t)
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	return sys, cl, w.ID(), stop, w.Drain
}

func submitSleep(t *testing.T, cl *client.Client, ms int) string {
	t.Helper()
	id, err := cl.Submit(context.Background(), "SLEEP", json.RawMessage(fmt.Sprintf(`{"durationMillis":%d}`, ms)))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func jobState(t *testing.T, cl *client.Client, id string) protocol.Job {
	t.Helper()
	j, err := cl.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// TestDrainFinishesRunningAttempts: a draining worker finishes what it runs, within its
// first attempt, and is assigned nothing more while it drains.
func TestDrainFinishesRunningAttempts(t *testing.T) {
	t.Parallel()
	sys, cl, _, stop, drain := drainSetup(t)
	running := submitSleep(t, cl, 400)
	testkit.Eventually(t, 15*time.Second, "job running", func() bool { return jobState(t, cl, running).State == protocol.StateRunning })

	if err := drain(context.Background()); err != nil {
		t.Fatalf("drain: %v", err)
	}
	// Drain returned once the attempt's result was acknowledged.
	j := jobState(t, cl, running)
	if j.State != protocol.StateCompleted || j.Attempts != 1 {
		t.Errorf("drained job %s after %d attempts, want COMPLETED after 1", j.State, j.Attempts)
	}
	// The draining worker, still registered with free slots, is assigned nothing more:
	// a job submitted now runs on the next worker to come.
	later := submitSleep(t, cl, 30000)
	next, _ := sys.StartNativeWorker(t)
	testkit.Eventually(t, 15*time.Second, "later job running", func() bool { return jobState(t, cl, later).State == protocol.StateRunning })
	if j := jobState(t, cl, later); j.WorkerID == nil || *j.WorkerID != next.ID() {
		t.Errorf("job submitted after the drain ran on %v, want the new worker %s", j.WorkerID, next.ID())
	}
	stop()
}

// TestDrainBoundedByContext: a drain whose context ends returns its error, and ending
// Run afterwards cancels what still runs; the attempt counts, and the job retries.
func TestDrainBoundedByContext(t *testing.T) {
	t.Parallel()
	_, cl, _, stop, drain := drainSetup(t)
	id := submitSleep(t, cl, 30000)
	testkit.Eventually(t, 15*time.Second, "job running", func() bool { return jobState(t, cl, id).State == protocol.StateRunning })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain past its deadline: %v", err)
	}
	stop()
	testkit.Eventually(t, 15*time.Second, "job back in the queue", func() bool {
		j := jobState(t, cl, id)
		return j.State != protocol.StateRunning && j.Attempts == 1
	})
}
