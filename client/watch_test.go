package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// TestWatch watches a job from submission to its end over each transport: natively
// the KV watch, over TCP polls of the job list.
func TestWatch(t *testing.T) {
	t.Parallel()
	transports := []struct {
		name     string
		client   func(t *testing.T, sys *jobbustest.System) *client.Client
		removals bool // only the KV watch sees a record deleted
	}{
		{"Native", func(_ *testing.T, sys *jobbustest.System) *client.Client { return client.New(sys.NC) }, true},
		{"TCP", func(t *testing.T, sys *jobbustest.System) *client.Client {
			c, err := client.DialTCP(context.Background(), sys.StartBridge(t).ClientAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		}, false},
	}
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			sys := jobbustest.Start(t)
			c := tr.client(t, sys)
			ctx := context.Background()
			// A job from before the watch is reported only once it changes.
			old, err := c.Submit(ctx, "SHA256", map[string]any{"text": "before"})
			if err != nil {
				t.Fatal(err)
			}

			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			events, err := c.Watch(wctx, client.WatchPollInterval(10*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			id, err := c.Submit(ctx, "SLEEP", map[string]any{"durationMillis": 300})
			if err != nil {
				t.Fatal(err)
			}
			sys.StartNativeWorker(t)

			seen := map[string][]protocol.Job{} // each job's events, in order
			completed := func(id string) bool {
				js := seen[id]
				return len(js) > 0 && js[len(js)-1].State == protocol.StateCompleted
			}
			for !completed(id) || !completed(old) {
				ev := next(t, events)
				if ev.Err != nil || ev.Type != client.JobChanged || ev.At.IsZero() {
					t.Fatalf("event %+v", ev)
				}
				if prev := seen[ev.Job.JobID]; len(prev) > 0 && sameView(prev[len(prev)-1], ev.Job) {
					t.Fatalf("job %s reported twice as %s/%d", ev.Job.JobID, ev.Job.State, ev.Job.Attempts)
				}
				seen[ev.Job.JobID] = append(seen[ev.Job.JobID], ev.Job)
			}
			if first := seen[old][0]; first.State == protocol.StateQueued {
				t.Errorf("the job from before the watch reported unchanged: %+v", first)
			}
			var running bool
			for _, j := range seen[id] {
				if j.State == protocol.StateRunning {
					running = j.WorkerID != nil && j.Attempts == 1
				}
			}
			if !running || seen[id][0].TaskType != "SLEEP" || seen[id][0].MaxAttempts != 3 {
				t.Errorf("the 300 ms job as watched: %+v, want it RUNNING on a worker on the way", seen[id])
			}

			if tr.removals {
				js, err := jetstream.New(sys.NC)
				if err != nil {
					t.Fatal(err)
				}
				kv, err := js.KeyValue(ctx, protocol.JobsBucket)
				if err != nil {
					t.Fatal(err)
				}
				if err := kv.Delete(ctx, old); err != nil {
					t.Fatal(err)
				}
				if ev := next(t, events); ev.Type != client.JobRemoved || ev.Job.JobID != old {
					t.Fatalf("after a delete: %+v, want %s removed", ev, old)
				}
			}

			cancel()
			for deadline := time.After(15 * time.Second); ; {
				select {
				case _, open := <-events:
					if !open {
						return
					}
				case <-deadline:
					t.Fatal("the channel stayed open after the context ended")
				}
			}
		})
	}
}

// TestWatchWithoutACoordinator: natively there is no bucket to watch until a
// coordinator has run.
func TestWatchWithoutACoordinator(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t, jobbustest.WithoutCoordinator())
	if _, err := client.New(sys.NC).Watch(context.Background()); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("watch without a bucket: %v", err)
	}
	if _, err := client.New(sys.NC).Watch(context.Background(), client.WatchPollInterval(0)); err == nil {
		t.Fatal("a zero poll interval accepted")
	}
}

func sameView(a, b protocol.Job) bool {
	return a.State == b.State && a.Attempts == b.Attempts && (a.WorkerID == nil) == (b.WorkerID == nil) &&
		(a.WorkerID == nil || *a.WorkerID == *b.WorkerID)
}

func next(t *testing.T, events <-chan client.JobEvent) client.JobEvent {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			t.Fatal("watch ended")
		}
		return ev
	case <-time.After(15 * time.Second):
		t.Fatal("no event in 15 s")
	}
	panic("unreachable")
}

// TestWatchIdleAcrossServerRestart: a watch that has seen no change yet when its NATS
// server restarts (jobbus serve stopped and started again, as the README suggests)
// reports the changes after it, not every job the bucket holds as if it had changed.
func TestWatchIdleAcrossServerRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := fmt.Sprintf("127.0.0.1:%d", jobbustest.FreePorts(t, 1)[0])
	dir := t.TempDir()
	start := func() *embeddednats.Server {
		srv, err := embeddednats.Start(ctx, embeddednats.WithListen(addr), embeddednats.WithStoreDir(dir))
		if err != nil {
			t.Fatalf("start NATS: %v", err)
		}
		return srv
	}
	srv := start()
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: protocol.JobsBucket})
	if err != nil {
		t.Fatal(err)
	}
	put := func(id string) {
		t.Helper()
		rec, _ := json.Marshal(protocol.Record{JobID: id, TaskType: "SHA256", State: protocol.StateCompleted, MaxAttempts: 3, Priority: protocol.PriorityNormal})
		// A reconnect in progress may refuse the first tries.
		for deadline := time.Now().Add(10 * time.Second); ; {
			if _, err = kv.Put(ctx, id, rec); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("put %s: %v", id, err)
		}
	}
	put("old-1")
	put("old-2")

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := client.New(nc).Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	shutdownCtx, done := context.WithTimeout(ctx, 10*time.Second)
	defer done()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		t.Fatal(err)
	}
	srv = start()
	defer func() { _ = srv.Shutdown(context.Background()) }()
	put("new")
	if ev := next(t, events); ev.Job.JobID != "new" {
		t.Fatalf("first event after the restart: job %s %s, want the new job", ev.Job.JobID, ev.Job.State)
	}
}
