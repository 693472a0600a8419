package coordinator_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
)

// TestGroupCommit runs jobs with group commit, both ways: writes in atomic batches (as
// with replicas, or a server that syncs each write) and writes synced a group at a
// time by the coordinator (serve --sync always on a lone server). Many submissions at
// once, with and without idempotency keys, all complete, and after a restart every key
// still names its job.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mod  func(*coordinator.Config, *syncedJobs)
	}{
		{"AtomicBatches", func(c *coordinator.Config, _ *syncedJobs) { c.SyncAlways = true }},
		{"CoordinatorSyncs", func(c *coordinator.Config, y *syncedJobs) { c.SyncJobs = y.sync }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var y syncedJobs
			s := setup(t, func(c *coordinator.Config) { tc.mod(c, &y) })
			y.start(s)
			groupCommit(t, s)
			if tc.name == "CoordinatorSyncs" && y.calls.Load() == 0 {
				t.Fatal("no sync was called")
			}
		})
	}
}

func groupCommit(t *testing.T, s *system) {
	ctx := context.Background()
	s.StartWorker(4)
	const n = 120
	ids := make([]string, n)
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 12 {
				var opts []client.SubmitOption
				if i%2 == 0 {
					opts = append(opts, client.IdempotencyKey(fmt.Sprint("key-", i)))
				}
				id, err := s.Client.Submit(ctx, "SHA256", text(fmt.Sprint(i)), opts...)
				if err != nil {
					t.Error(err)
					return
				}
				ids[i] = id
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, id := range ids {
		if j := s.Wait(id); j.State != protocol.StateCompleted {
			t.Fatalf("job %+v", j)
		}
	}
	s.RestartCoordinator(t)
	for i := 0; i < n; i += 2 {
		id, err := s.Client.Submit(ctx, "SHA256", text(fmt.Sprint(i)), client.IdempotencyKey(fmt.Sprint("key-", i)))
		must(t, err)
		if id != ids[i] {
			t.Fatalf("key-%d names %s after a restart, want %s", i, id, ids[i])
		}
	}
}

// TestOldBindingsMoveIntoJobs: a store written before idempotency bindings moved into
// the jobs bucket keeps its keys: recovery moves them and removes the old bucket.
func TestOldBindingsMoveIntoJobs(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	s.StartWorker(1)
	id, err := s.Client.Submit(ctx, "SHA256", text("old"), client.IdempotencyKey("old key"))
	must(t, err)
	s.Wait(id)

	// As the earlier layout had it: the binding in its own bucket only.
	js, err := jetstream.New(s.NC)
	must(t, err)
	jobs, err := js.KeyValue(ctx, protocol.JobsBucket)
	must(t, err)
	name := protocol.KeyPrefix + base64.RawURLEncoding.EncodeToString([]byte("old key"))
	var e jetstream.KeyValueEntry
	s.Eventually("the finished job's binding stored", func() bool {
		e, err = jobs.Get(ctx, name)
		return err == nil
	})
	must(t, jobs.Purge(ctx, name))
	keys, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: protocol.KeysBucket})
	must(t, err)
	_, err = keys.Put(ctx, name, e.Value())
	must(t, err)

	s.RestartCoordinator(t)
	again, err := s.Client.Submit(ctx, "SHA256", text("old"), client.IdempotencyKey("old key"))
	must(t, err)
	if again != id {
		t.Fatalf("the old key names %s, want %s", again, id)
	}
	if _, err := js.KeyValue(ctx, protocol.KeysBucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("old bucket after the move: %v", err)
	}
}
