package bridge_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// TestCloseDeliversResultsAlreadyRead: a spec worker sends its result while no
// coordinator serves (a failover, a restart beside the bridge), and the bridge is
// stopped (Ctrl-C, a rolling restart) before the result is answered. Close stops
// reading, closing the worker's connection, and gives the result its ShutdownTimeout:
// the coordinator that serves meanwhile takes it, and the job completes with it, on
// its only attempt. A spec worker never sends a result again, so before, when Close
// abandoned the result at once, the attempt was lost although the worker finished it.
func TestCloseDeliversResultsAlreadyRead(t *testing.T) {
	t.Parallel()
	s := setup(t, withBridge(func(c *bridgeConfig) {
		c.RequestTimeout, c.ResultRetryFor, c.ShutdownTimeout = 200*time.Millisecond, waitFor, waitFor
	}))
	job, w := resultUnanswered(t, s, "stopped-bridge")
	closed := make(chan struct{})
	go func() {
		_ = s.br.Close()
		close(closed)
	}()
	w.ExpectClosed() // Close reads nothing more
	s.StartCoordinator(t)
	select {
	case <-closed:
	case <-time.After(waitFor):
		t.Fatalf("Close has not returned %v after the coordinator came back", waitFor)
	}
	if st := s.br.Stats().Results; st.Answered != 1 || st.Abandoned != 0 {
		t.Fatalf("results %+v once closed, want the one read answered", st)
	}
	var j protocol.Job
	eventually(t, "job "+job+" ended", func() bool { j = s.job(job); return j.State.Terminal() })
	if j.State != protocol.StateCompleted || j.Attempts != 1 || deref(j.Result) != "first" {
		t.Fatalf("job %s after %d attempts, result %q, error %q: want COMPLETED with the result read before Close",
			j.State, j.Attempts, deref(j.Result), deref(j.Error))
	}
}

// TestCloseAbandonsResultsAfterShutdownTimeout: while no coordinator comes back,
// Close keeps offering a result it read for its ShutdownTimeout, not for the much
// longer ResultRetryFor, and then abandons it.
func TestCloseAbandonsResultsAfterShutdownTimeout(t *testing.T) {
	t.Parallel()
	const shutdownTimeout = 500 * time.Millisecond
	s := setup(t, withBridge(func(c *bridgeConfig) {
		c.RequestTimeout, c.ResultRetryFor, c.ShutdownTimeout = 100*time.Millisecond, time.Hour, shutdownTimeout
	}))
	_, _ = resultUnanswered(t, s, "unanswered-at-close")
	start := time.Now()
	_ = s.br.Close()
	took := time.Since(start)
	if took < shutdownTimeout || took > shutdownTimeout+waitFor/2 {
		t.Fatalf("Close took %v, want its ShutdownTimeout (%v) and little more", took, shutdownTimeout)
	}
	if st := s.br.Stats().Results; st.Abandoned != 1 || st.Answered != 0 {
		t.Fatalf("results %+v, want the one read abandoned", st)
	}
}

// resultUnanswered registers spec worker id, has it assigned a job of one attempt,
// closes the coordinator, and has the worker send the job's result (result "first"):
// it returns the job and the worker once the bridge has offered the result to nobody.
func resultUnanswered(t *testing.T, s *system, id string) (job string, w *peer) {
	t.Helper()
	w = s.worker(id, 1)
	job, err := s.native.Submit(context.Background(), "SHA256", json.RawMessage(`{"text":"x"}`), client.MaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	a := w.ExpectAssign(job)
	if err := s.Coordinator.Close(); err != nil {
		t.Fatal(err)
	}
	offers := timeOffers(t, s.NC, id)
	w.MustSend(&protocol.TaskResult{WorkerID: id, JobID: job, AttemptID: a.AttemptID, Success: true, Result: ptr("first")})
	eventually(t, "the result offered", func() bool { return offers.since(time.Time{}) > 0 })
	return job, w
}
