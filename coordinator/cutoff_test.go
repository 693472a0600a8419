package coordinator_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
)

// TestAssignmentLostInWorkerOutage is a real worker cut off from NATS (its connection
// runs through a proxy the test cuts) while the coordinator, which has not yet missed
// its heartbeats, assigns it a job of one attempt: the TASK_ASSIGN goes to a subject
// nobody subscribes to, and is lost. Once the worker is back, its heartbeats report that
// it does not hold the attempt, the job is queued again without counting it, and the
// worker runs it: COMPLETED on attempt 1. Registering again on the reconnect, as the
// worker used to, superseded its registration and spent the attempt: FAILED.
func TestAssignmentLostInWorkerOutage(t *testing.T) {
	t.Parallel()
	s := reconcileSystem(t) // no worker lost for silence, no deadline: only reconciliation moves the job
	u, err := url.Parse(s.Server.ClientURL())
	must(t, err)
	proxy := testkit.NewProxy(t, u.Host)
	nc, err := nats.Connect("nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	must(t, err)
	t.Cleanup(nc.Close)
	w, err := worker.New(nc, worker.WithID("cut"), worker.WithHeartbeat(50*time.Millisecond), worker.WithLogger(nil))
	must(t, err)
	t.Cleanup(func() { _ = w.Close() })
	jobbustest.Go(t, w.Run)
	s.Eventually("worker listed", func() bool { return s.HasWorker("cut") })

	proxy.Cut()
	s.Eventually("worker cut off", func() bool { return !nc.IsConnected() })
	id := s.Submit("SHA256", text("x"), client.MaxAttempts(1))
	if j := s.WaitState(id, protocol.StateRunning); deref(j.WorkerID) != "cut" {
		t.Fatalf("job %+v assigned elsewhere", j)
	}
	proxy.Restore()

	var j protocol.Job
	testkit.Eventually(t, 20*time.Second, "job finished", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		j, err = s.Client.Status(ctx, id)
		return err == nil && j.State.Terminal()
	})
	if j.State != protocol.StateCompleted || j.Attempts != 1 || j.Error != nil {
		t.Fatalf("job %+v error %q: want COMPLETED on its one attempt", j, deref(j.Error))
	}
}
