package coordinator

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	jobworker "github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tasks"
)

// TestUniqueSurvivesRestart: the jobs that hold a unique key hold it after a restart,
// whichever way recovery reads the store: after a graceful stop (its checkpoint), after
// a crash (a checkpoint from the middle of the term, then writes), and with the
// checkpoint ignored (every record's headers). A job that completed within its window
// holds it; one still active holds it, one SCHEDULED beyond the schedule window (whose
// record recovery does not otherwise read whole) included; a cancelled one does not.
func TestUniqueSurvivesRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, cfg, logs, start := restartable(t)
	cl := client.New(nc)
	submit := func(taskType, text string, opts ...client.SubmitOption) string {
		t.Helper()
		id, err := cl.Submit(ctx, taskType, map[string]string{"text": text}, opts...)
		must(t, err)
		return id
	}
	waitState := func(id string, st protocol.State) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			j, err := cl.Status(ctx, id)
			if err == nil && j.State == st {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s: %+v %v, want %s", id, j, err, st)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// A worker that runs SHA256 only: WORD_COUNT jobs stay QUEUED, active.
	wctx, stopWorker := context.WithCancel(ctx)
	only := tasks.NewRegistry()
	sha, _ := tasks.Builtins().Lookup("SHA256")
	must(t, only.Register("SHA256", sha))
	w, err := jobworker.New(nc, jobworker.WithCapacity(4), jobworker.WithLogger(nil), jobworker.WithTasks(only))
	must(t, err)
	workerDone := make(chan struct{})
	go func() { defer close(workerDone); _ = w.Run(wctx) }()
	t.Cleanup(func() { stopWorker(); <-workerDone; _ = w.Close() })

	c1 := start(cfg)
	done := submit("SHA256", "done", client.UniqueFor(time.Hour), client.IdempotencyKey("done-key"))
	waitState(done, protocol.StateCompleted)
	active := submit("WORD_COUNT", "active", client.UniqueWhileActive())
	dueLater := func() string {
		return submit("WORD_COUNT", "due later", client.UniqueWhileActive(), client.RunIn(time.Hour))
	}
	scheduled := dueLater()
	cancelled := submit("WORD_COUNT", "cancelled", client.UniqueFor(time.Hour))
	_, _, err = cl.Cancel(ctx, cancelled)
	must(t, err)

	expect := func(when string) {
		t.Helper()
		if got := submit("SHA256", "done", client.UniqueFor(time.Hour)); got != done {
			t.Fatalf("%s: the completed job within its window is %s, a resubmission got %s", when, done, got)
		}
		if got := submit("SHA256", "done", client.IdempotencyKey("done-key")); got != done {
			t.Fatalf("%s: its idempotency key names %s, want %s", when, got, done)
		}
		if got := submit("WORD_COUNT", "active", client.UniqueWhileActive()); got != active {
			t.Fatalf("%s: the active job is %s, a resubmission got %s", when, active, got)
		}
		if got := dueLater(); got != scheduled {
			t.Fatalf("%s: the job SCHEDULED an hour ahead is %s, a resubmission got %s", when, scheduled, got)
		}
		fresh := submit("WORD_COUNT", "cancelled", client.UniqueFor(time.Hour))
		if fresh == cancelled {
			t.Fatalf("%s: a cancelled job still holds its key", when)
		}
		_, _, err := cl.Cancel(ctx, fresh) // it holds the key now: release it for the next round
		must(t, err)
	}
	expect("before a restart")
	must(t, c1.Close()) // a graceful stop writes the checkpoint
	logs.Take()

	c2 := start(cfg)
	if !strings.Contains(logs.Take(), "recovering from a checkpoint") {
		t.Fatal("the checkpoint written at the stop was not used")
	}
	expect("after a stop")

	must(t, c2.ckpt.write(ctx)) // a checkpoint in the middle of the term, then writes
	later := submit("SHA256", "later", client.UniqueFor(time.Hour))
	waitState(later, protocol.StateCompleted)
	c2.ckpt.running.Store(true) // a crash: no checkpoint at the stop
	must(t, c2.Close())
	c3 := start(cfg)
	if !strings.Contains(logs.Take(), "recovering from a checkpoint") {
		t.Fatal("the checkpoint of the term before was not used")
	}
	expect("after a crash")
	if got := submit("SHA256", "later", client.UniqueFor(time.Hour)); got != later {
		t.Fatalf("after a crash: the job completed after the checkpoint is %s, a resubmission got %s", later, got)
	}
	must(t, c3.Close())

	full := cfg
	full.fullRecovery = true
	start(full)
	if strings.Contains(logs.Take(), "recovering from a checkpoint") {
		t.Fatal("a checkpoint was used for the full recovery")
	}
	expect("from every record's headers")
	if got := submit("SHA256", "later", client.UniqueFor(time.Hour)); got != later {
		t.Fatalf("from every record's headers: %s holds the key, a resubmission got %s", later, got)
	}
}

// TestUniqueForEndsWithItsWindow: a job unique for a window holds its key for the
// window, whatever its state: one still QUEUED (or retrying) when the window ends does
// not answer for the same work any longer, as Asynq's Unique(ttl) and River's ByPeriod
// do not; the job that then comes holds the key.
func TestUniqueForEndsWithItsWindow(t *testing.T) {
	s := startMem(t, nil)
	unique := func(forMillis int64) *protocol.SubmitJob {
		req := sha("x")
		req.UniqueForMillis = forMillis
		return req
	}
	first := s.accepted(unique(60_000)) // no worker: it stays QUEUED
	s.clock.advance(59 * time.Second)
	if got := s.accepted(unique(60_000)); got != first {
		t.Fatalf("within the window: got %s, want the unique job %s", got, first)
	}
	s.clock.advance(time.Second)
	second := s.accepted(unique(60_000))
	if second == first {
		t.Fatalf("the window ended, yet the job %s, still %s, answered", first, s.status(first).State)
	}
	if got := s.accepted(unique(60_000)); got != second {
		t.Fatalf("the new job holds the key: got %s, want %s", got, second)
	}
}

// TestUniqueScheduledOfAnOlderRelease: a unique job SCHEDULED beyond the schedule window
// by a release before its record carried Jobbus-Unique-Until keeps its key once a newer
// coordinator runs on the store, whether recovery reads that release's checkpoint or
// every record's headers. Its record was known by its head only, so after an upgrade
// the same work submitted again made a second job.
func TestUniqueScheduledOfAnOlderRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, cfg, logs, start := restartable(t)
	cl := client.New(nc)
	dueLater := func() string {
		t.Helper()
		id, err := cl.Submit(ctx, "WORD_COUNT", map[string]string{"text": "due later"}, client.UniqueWhileActive(), client.RunIn(time.Hour))
		must(t, err)
		return id
	}
	c := start(cfg)
	scheduled := dueLater()
	must(t, c.Close())

	// The store as the older release left it: the record without the header, the
	// checkpoint (of that release's format) naming the job by its head.
	js, err := jetstream.New(nc)
	must(t, err)
	stream, err := js.Stream(ctx, "KV_"+protocol.JobsBucket)
	must(t, err)
	m, err := stream.GetLastMsgForSubject(ctx, jobsSubjects+scheduled)
	must(t, err)
	old := nats.NewMsg(m.Subject)
	old.Data = m.Data
	for _, k := range []string{protocol.HeaderSeq, protocol.HeaderState, protocol.HeaderRunAt} {
		old.Header.Set(k, m.Header.Get(k))
	}
	_, err = js.PublishMsg(ctx, old)
	must(t, err)
	ckpts, err := openCheckpoints(ctx, js, 1)
	must(t, err)
	data, err := ckpts.GetBytes(ctx, checkpointObject)
	must(t, err)
	term, _, heads, err := decodeCheckpoint(data)
	must(t, err)
	info, err := stream.Info(ctx)
	must(t, err)
	var r protocol.Record
	must(t, json.Unmarshal(m.Data, &r))
	for i := range heads {
		if heads[i].id == scheduled {
			heads[i] = head{seq: heads[i].seq, id: scheduled, state: protocol.StateScheduled, due: r.RunAt}
		}
	}
	oldCkpt := encodeCheckpoint(term, info.State.LastSeq, heads)
	oldCkpt = append([]byte("jobbus-index-2\n"), oldCkpt[len(checkpointMagic):]...)
	_, err = ckpts.PutBytes(ctx, checkpointObject, oldCkpt)
	must(t, err)
	logs.Take()

	c = start(cfg)
	if got := dueLater(); got != scheduled {
		t.Fatalf("after an upgrade: the job SCHEDULED an hour ahead is %s, a resubmission got %s", scheduled, got)
	}
	must(t, c.Close())

	full := cfg
	full.fullRecovery = true
	start(full)
	if got := dueLater(); got != scheduled {
		t.Fatalf("from every record's headers: the job SCHEDULED an hour ahead is %s, a resubmission got %s", scheduled, got)
	}
}
