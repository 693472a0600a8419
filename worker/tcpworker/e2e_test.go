package tcpworker_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker/tcpworker"
)

// TestEndToEnd runs the whole system over the spec ports: embedded NATS, a
// coordinator, a bridge, this package's TCP worker and the Go client over TCP.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := embeddednats.Start(ctx, embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	cfg := coordinator.DefaultConfig()
	cfg.HeartbeatTimeout = 2 * time.Second
	cfg.SweepInterval = 10 * time.Millisecond
	cfg.RetryBaseDelay = 10 * time.Millisecond
	cfg.RetryMaxDelay = 40 * time.Millisecond
	coord, err := coordinator.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := coord.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = coord.Close() })

	bcfg := bridge.DefaultConfig()
	bcfg.WorkerListen, bcfg.ClientListen = "127.0.0.1:0", "127.0.0.1:0"
	br, err := bridge.New(nc, bcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = br.Close() })

	w := startWorker(t, br.WorkerAddr().String(), tcpworker.WithID("worker-e2e"), tcpworker.WithCapacity(2))
	c, err := client.DialTCP(ctx, br.ClientAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	testkit.Eventually(t, waitLimit, "the TCP worker listed", func() bool {
		ws, err := c.Workers(ctx)
		return err == nil && len(ws) == 1 && ws[0].WorkerID == "worker-e2e" && ws[0].Capacity == 2
	})
	wait := func(id string) protocol.Job {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		job, err := c.Wait(wctx, id)
		if err != nil {
			t.Fatalf("wait %s: %v", id, err)
		}
		return job
	}

	t.Run("CompletesAJob", func(t *testing.T) {
		id, err := c.Submit(ctx, "SHA256", map[string]string{"text": "hello"})
		if err != nil {
			t.Fatal(err)
		}
		job := wait(id)
		if job.State != protocol.StateCompleted || deref(job.Result) != "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" {
			t.Fatalf("job %+v, result %q", job, deref(job.Result))
		}
	})
	t.Run("RetriesAFailedAttempt", func(t *testing.T) {
		id, err := c.Submit(ctx, "FAIL", map[string]int{"failUntilAttempt": 2}, client.MaxAttempts(3))
		if err != nil {
			t.Fatal(err)
		}
		job := wait(id)
		if job.State != protocol.StateCompleted || job.Attempts != 2 || deref(job.Result) != "succeeded on attempt 2" ||
			deref(job.Error) != "deliberate failure on attempt 1 (failing until 2)" {
			t.Fatalf("job %+v, result %q, error %q", job, deref(job.Result), deref(job.Error))
		}
	})
	t.Run("CancelReachesTheWorker", func(t *testing.T) {
		id, err := c.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 30000})
		if err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, waitLimit, "the sleep running on the worker", func() bool { return w.Running() == 1 })
		cancelled, job, err := c.Cancel(ctx, id)
		if err != nil || !cancelled || job.State != protocol.StateCancelled {
			t.Fatalf("Cancel = %v %+v, %v", cancelled, job, err)
		}
		testkit.Eventually(t, waitLimit, "the sleep interrupted by TASK_CANCEL", func() bool { return w.Running() == 0 })
	})
	t.Run("ReconnectsToANewBridge", func(t *testing.T) {
		waddr, caddr := br.WorkerAddr().String(), br.ClientAddr().String()
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
		bcfg.WorkerListen, bcfg.ClientListen = waddr, caddr
		br2, err := bridge.New(nc, bcfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := br2.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = br2.Close() })
		// The client's connection died with the old bridge: one request fails, the
		// next dials the new bridge.
		_, _ = c.Workers(ctx)
		id, err := c.Submit(ctx, "WORD_COUNT", map[string]string{"text": "one two three"})
		if err != nil {
			t.Fatal(err)
		}
		job := wait(id)
		if job.State != protocol.StateCompleted || deref(job.Result) != "3" {
			t.Fatalf("job %+v, result %q, error %q", job, deref(job.Result), deref(job.Error))
		}
	})
}
