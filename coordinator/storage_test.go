package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
)

// TestStoreFull: with JetStream's storage limit reached (another stream of the account
// took the room), submissions are refused at once with an ERROR that says so and what
// to do, never with JOB_SUBMITTED; a job running meanwhile is not lost: its result's
// write is retried, and stored once room returns; then the coordinator accepts and runs jobs again by
// itself. The leader lease is longer than the test, so this is the store, not failover.
func TestStoreFull(t *testing.T) {
	const waitFor = 20 * time.Second
	t.Parallel()
	const limit = 4 << 20
	srv, err := embeddednats.Start(context.Background(), embeddednats.WithListen("127.0.0.1:-1"),
		embeddednats.WithStoreDir(t.TempDir()), embeddednats.WithJetStreamLimits(0, limit))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := jobbustest.FastCoordinatorConfig()
	cfg.HeartbeatTimeout = time.Minute
	cfg.LeaderLease = 10 * time.Minute
	obs := &fullObserver{}
	cfg.Observer = obs
	jobbustest.Go(t, func(ctx context.Context) error { return coordinator.Run(ctx, nc, cfg, nil) })
	wnc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wnc.Close)
	w, err := worker.New(wnc, worker.WithHeartbeat(100*time.Millisecond), worker.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	jobbustest.Go(t, w.Run)
	c := client.New(nc, client.WithTimeout(waitFor))
	ctx := context.Background()
	testkit.Eventually(t, waitFor, "the worker listed", func() bool { return jobbustest.WorkerListed(c, w.ID()) })

	running, err := c.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 3000}, func(s *protocol.SubmitJob) { s.MaxAttempts = 1 })
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitFor, "the job running", func() bool {
		j, err := c.Status(ctx, running)
		return err == nil && j.State == protocol.StateRunning
	})

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	filler := fillStore(t, js)

	// The running job's result cannot be stored: it stays RUNNING, and the failed
	// write tells the coordinator that the store is full. (A submission that came
	// first would wait for room: its record's write is retried like any other.)
	if j, err := c.Status(ctx, running); err != nil || j.State != protocol.StateRunning {
		t.Fatalf("the job ended before the store was full: %+v %v", j, err)
	}
	testkit.Eventually(t, waitFor, "a job write refused for want of room", obs.full.Load)
	var refused string
	testkit.Wait(t, waitFor, func() error {
		_, err := c.Submit(ctx, "SHA256", map[string]string{"text": "no room"}, func(s *protocol.SubmitJob) { s.MaxAttempts = 1 })
		switch {
		case err != nil && strings.Contains(err.Error(), "job not stored: the job store is full"):
			refused = err.Error()
			return nil
		case err == nil:
			// There was room for one more record after all: it is stored, so
			// JOB_SUBMITTED was true. Fill again.
			fillStore(t, js)
			return errors.New("a submission found room")
		}
		return fmt.Errorf("submit with the store full: %v", err)
	})
	t.Logf("refused: %s", refused)
	for _, want := range []string{"job store is full", "--nats-max-store", "max_file_store"} {
		if !strings.Contains(refused, want) {
			t.Errorf("refusal %q does not say %q", refused, want)
		}
	}
	// Status still answers (from memory: the result is known, its write pending).
	if j, err := c.Status(ctx, running); err != nil || (j.State != protocol.StateRunning && j.State != protocol.StateCompleted) {
		t.Fatalf("the running job with the store full: %+v %v, want RUNNING or COMPLETED", j, err)
	}

	if err := js.DeleteStream(ctx, filler); err != nil {
		t.Fatal(err)
	}
	j, err := c.Wait(ctx, running)
	if err != nil || j.State != protocol.StateCompleted || j.Result == nil || *j.Result != "slept 3000 ms" {
		t.Fatalf("the job that ran while the store was full: %+v %v, want COMPLETED with its result", j, err)
	}
	testkit.Wait(t, waitFor, func() error {
		id, err := c.Submit(ctx, "SHA256", map[string]string{"text": "room again"})
		if err != nil {
			return err
		}
		j, err := c.Wait(ctx, id)
		if err != nil || j.State != protocol.StateCompleted {
			return fmt.Errorf("job after the store recovered: %+v %v", j, err)
		}
		return nil
	})
}

// fillStore publishes to a stream of its own until JetStream refuses for want of room,
// in ever smaller messages, so that not even a small job record fits; it returns the
// stream's name.
func fillStore(t *testing.T, js jetstream.JetStream) string {
	t.Helper()
	ctx := context.Background()
	const name = "FILLER"
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"filler.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	for size := 64 << 10; size >= 16; size /= 4 {
		data := make([]byte, size)
		for {
			_, err := js.Publish(ctx, "filler.x", data)
			if err == nil {
				continue
			}
			if !coordinator.StoreFull(err) {
				t.Fatalf("filling the store: %v", err)
			}
			break
		}
	}
	return name
}

// fullObserver notes a job write refused because the store is full.
type fullObserver struct{ full atomic.Bool }

func (o *fullObserver) Submitted(coordinator.SubmitOutcome) {}
func (o *fullObserver) JobChanged(coordinator.JobChange)    {}
func (o *fullObserver) DeadlineExpired(string)              {}
func (o *fullObserver) Synced(time.Duration, int, error)    {}
func (o *fullObserver) Stored(_ time.Duration, err error, _ bool, _ int) {
	if coordinator.StoreFull(err) {
		o.full.Store(true)
	}
}

// TestStoreFullOfJobs: when submissions fill the store up to its JetStream cap
// (Config.StoreLimit, serve's --nats-max-store), the jobs bucket's own limit refuses
// them while room is left for the leader lease: for leases after, the coordinator
// still leads, answers status and lists, and refuses each submission with the ERROR
// that says the store is full. Every job accepted is kept, and runs once room returns
// (here: the bucket's limit lifted, as a higher cap would). In a cluster whose
// servers have the same cap, each server's copy of the jobs stays under it alike.
func TestStoreFullOfJobs(t *testing.T) {
	t.Parallel()
	const limit = 4 << 20
	t.Run("LoneServer", func(t *testing.T) {
		t.Parallel()
		storeFullOfJobs(t, startServer(t, embeddednats.WithJetStreamLimits(0, limit)), limit)
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		nodes := jobbustest.StartCluster(t, 3, embeddednats.WithJetStreamLimits(0, limit))
		storeFullOfJobs(t, nodes[0], limit)
	})
}

func storeFullOfJobs(t *testing.T, srv *embeddednats.Server, limit int64) {
	const waitFor = 30 * time.Second
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := jobbustest.FastCoordinatorConfig()
	cfg.LeaderLease = time.Second
	cfg.StoreLimit = limit
	jobbustest.Go(t, func(ctx context.Context) error { return coordinator.Run(ctx, nc, cfg, nil) })
	c := client.New(nc, client.WithTimeout(waitFor))
	ctx := context.Background()

	// No worker: the jobs stay QUEUED, and their records fill the store.
	text := strings.Repeat("x", 64<<10)
	var accepted []string
	var refused string
	testkit.Wait(t, waitFor, func() error {
		id, err := c.Submit(ctx, "SHA256", map[string]string{"text": text})
		switch {
		case err == nil:
			accepted = append(accepted, id)
			return errors.New("still room")
		case strings.Contains(err.Error(), "job not stored: the job store is full"):
			refused = err.Error()
			return nil
		}
		return fmt.Errorf("submit: %w", err)
	})
	t.Logf("%d jobs accepted, then: %s", len(accepted), refused)
	if len(accepted) == 0 {
		t.Fatal("no job accepted before the store was full")
	}

	// Several leases on, the coordinator still leads: reads answer, and a submission
	// hears that the store is full, never "not serving" or "Outcome unknown".
	for end := time.Now().Add(3 * cfg.LeaderLease); time.Now().Before(end); {
		if j, err := c.Status(ctx, accepted[0]); err != nil || j.State != protocol.StateQueued {
			t.Fatalf("status with the store full: %+v %v, want QUEUED", j, err)
		}
		if l, err := c.List(ctx, protocol.ListJobs{Limit: 5}); err != nil || len(l.Jobs) == 0 {
			t.Fatalf("list with the store full: %+v %v", l, err)
		}
		_, err := c.Submit(ctx, "SHA256", map[string]string{"text": text})
		if err == nil || !strings.Contains(err.Error(), "job not stored: the job store is full") {
			t.Fatalf("submit with the store full: %v, want the store-full ERROR", err)
		}
	}

	// Room returns: every accepted job runs.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "KV_"+protocol.JobsBucket)
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.MaxBytes = -1
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	wnc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wnc.Close)
	w, err := worker.New(wnc, worker.WithHeartbeat(100*time.Millisecond), worker.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	jobbustest.Go(t, w.Run)
	wctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	for _, id := range accepted {
		if j, err := c.Wait(wctx, id); err != nil || j.State != protocol.StateCompleted {
			t.Fatalf("job %s accepted before the store was full: %+v %v, want COMPLETED", id, j, err)
		}
	}
}
