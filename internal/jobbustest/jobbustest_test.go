package jobbustest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher()) }

const waitFor = 15 * time.Second

// TestSystemRunsJobs: a native worker runs a job submitted over NATS and over the
// bridge's client port, and leaves when stopped.
func TestSystemRunsJobs(t *testing.T) {
	t.Parallel()
	s := jobbustest.Start(t)
	w, stop := s.StartNativeWorker(t, worker.WithCapacity(2))
	native := client.New(s.NC)
	testkit.Eventually(t, waitFor, "worker listed", func() bool { return jobbustest.WorkerListed(native, w.ID()) })

	b := s.StartBridge(t, func(c *bridge.Config) { c.WorkerListen = "" })
	if b.WorkerAddr() != nil {
		t.Fatalf("worker port %v, want none", b.WorkerAddr())
	}
	tcp, err := client.DialTCP(context.Background(), b.ClientAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	for _, c := range []*client.Client{native, tcp} {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		id, err := c.Submit(ctx, "WORD_COUNT", map[string]string{"text": "a b c"})
		if err != nil {
			t.Fatal(err)
		}
		j, err := c.Wait(ctx, id)
		cancel()
		if err != nil || j.Result == nil || *j.Result != "3" {
			t.Fatalf("job %+v (%v), want 3 from the only worker", j, err)
		}
	}
	stop()
	stop() // idempotent
	testkit.Eventually(t, waitFor, "worker gone", func() bool { return !jobbustest.WorkerListed(native, w.ID()) })
}

// TestCoordinatorLaterAndRestarted: WithoutCoordinator leaves the API unanswered until
// StartCoordinator; RestartCoordinator keeps the jobs and applies the change.
func TestCoordinatorLaterAndRestarted(t *testing.T) {
	t.Parallel()
	s := jobbustest.Start(t, jobbustest.WithoutCoordinator(),
		jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) { c.MaxActiveJobs = 7 }))
	if s.Coordinator != nil || s.Config.MaxActiveJobs != 7 || s.Config.SweepInterval != jobbustest.FastCoordinatorConfig().SweepInterval {
		t.Fatalf("coordinator %v, config %+v", s.Coordinator, s.Config)
	}
	c := client.New(s.NC)
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.Status(short, "x"); err == nil {
		t.Fatal("a status answered without a coordinator")
	}
	s.StartCoordinator(t)
	id, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": "x"})
	if err != nil {
		t.Fatal(err)
	}
	first := s.Coordinator
	s.RestartCoordinator(t, func(c *coordinator.Config) { c.MaxActiveJobs = 1 })
	if s.Coordinator == first || s.Config.MaxActiveJobs != 1 {
		t.Fatalf("not restarted with the change: %+v", s.Config)
	}
	if j, err := c.Status(context.Background(), id); err != nil || j.JobID != id {
		t.Fatalf("job after restart %+v (%v)", j, err)
	}
	if _, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": "y"}); !errors.Is(err, client.ErrRejected) {
		t.Fatalf("second active job with a limit of 1: %v, want ErrRejected", err)
	}
}

// TestGoStops: stop ends run's context and waits for it.
func TestGoStops(t *testing.T) {
	t.Parallel()
	ended := make(chan struct{})
	stop := jobbustest.Go(t, func(ctx context.Context) error {
		<-ctx.Done()
		close(ended)
		return ctx.Err()
	})
	stop()
	select {
	case <-ended:
	default:
		t.Fatal("stop returned before run")
	}
	stop()
}
