package coordinator

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/testkit"
)

// restartable starts a NATS server with a store of the test's and returns a connection
// to it, a config whose log goes to logs, and start, which starts a coordinator with a
// config (stopped with the test): for tests that restart coordinators on one store.
func restartable(t *testing.T) (nc *nats.Conn, cfg Config, logs *testkit.Buffer, start func(Config) *Coordinator) {
	t.Helper()
	ctx := context.Background()
	srv, err := embeddednats.Start(ctx, embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()))
	must(t, err)
	t.Cleanup(func() { _ = srv.Shutdown(ctx) })
	nc, err = srv.Connect()
	must(t, err)
	t.Cleanup(nc.Close)
	logs = &testkit.Buffer{}
	cfg = DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	start = func(cfg Config) *Coordinator {
		t.Helper()
		c, err := New(nc, cfg)
		must(t, err)
		must(t, c.Start(ctx))
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	return nc, cfg, logs, start
}

// TestRestartFromCheckpoint: a restart reads the checkpoint of the last term and what
// was written after it, and knows every job and idempotency key as a full read would:
// after a graceful stop (the checkpoint written then), after a crash (a checkpoint from
// the middle of the term, then writes), and with the checkpoint ignored.
func TestRestartFromCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, cfg, logs, start := restartable(t)
	cl := client.New(nc)
	submit := func(key string) string {
		t.Helper()
		var opts []client.SubmitOption
		if key != "" {
			opts = append(opts, client.IdempotencyKey(key))
		}
		id, err := cl.Submit(ctx, "SHA256", map[string]string{"text": key}, opts...)
		must(t, err)
		return id
	}
	cancel := func(id string) {
		t.Helper()
		_, _, err := cl.Cancel(ctx, id)
		must(t, err)
	}
	expect := func(when string, want map[string]protocol.State, keys map[string]string) {
		t.Helper()
		for id, st := range want {
			j, err := cl.Status(ctx, id)
			if err != nil || j.State != st {
				t.Fatalf("%s: job %s %+v %v, want %s", when, id, j, err, st)
			}
		}
		list, err := cl.List(ctx, protocol.ListJobs{})
		must(t, err)
		if len(list.Jobs) != len(want) {
			t.Fatalf("%s: %d jobs listed, want %d", when, len(list.Jobs), len(want))
		}
		for key, id := range keys {
			if got := submit(key); got != id {
				t.Fatalf("%s: key %q names %s, want %s", when, key, got, id)
			}
		}
	}

	c1 := start(cfg)
	a := submit("a")
	cancel(a)
	b := submit("b")
	must(t, c1.Close()) // a graceful stop writes the checkpoint
	logs.Take()

	c2 := start(cfg)
	if !strings.Contains(logs.Take(), "recovering from a checkpoint") {
		t.Fatal("the checkpoint written at the stop was not used")
	}
	expect("after a stop", map[string]protocol.State{a: protocol.StateCancelled, b: protocol.StateQueued}, map[string]string{"a": a, "b": b})

	must(t, c2.ckpt.write(ctx)) // as the term's writes would start one
	d := submit("d")
	cancel(d)
	e := submit("")
	cancel(b)
	c2.ckpt.running.Store(true) // a crash: no checkpoint at the stop
	must(t, c2.Close())

	start(cfg)
	if !strings.Contains(logs.Take(), "recovering from a checkpoint") {
		t.Fatal("the checkpoint of the term before was not used")
	}
	want := map[string]protocol.State{a: protocol.StateCancelled, b: protocol.StateCancelled, d: protocol.StateCancelled, e: protocol.StateQueued}
	keys := map[string]string{"a": a, "b": b, "d": d}
	expect("after a crash", want, keys)

	full := cfg
	full.fullRecovery = true // as Run sets after a fence
	start(full)
	if strings.Contains(logs.Take(), "recovering from a checkpoint") {
		t.Fatal("a checkpoint was used after a fence")
	}
	expect("without the checkpoint", want, keys)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointEncoding: a checkpoint decodes to what was encoded, and a damaged one
// (cut anywhere, or of another format) is refused, never half read.
func TestCheckpointEncoding(t *testing.T) {
	t.Parallel()
	heads := []head{
		{id: "b1c0", seq: 1, state: protocol.StateCompleted, expires: 1796000000000, key: "k", fingerprint: "f"},
		{id: "b1c1", seq: 300, state: protocol.StateFailed},
		{id: "b1c2", seq: 1 << 40},
		{id: "b1c3", seq: 301, state: protocol.StateScheduled, due: 1796000000123, key: "later", fingerprint: "g", queue: "critical"}, // cold: its due time and queue
		{id: "b1c4", seq: 302, state: protocol.StateScheduled, due: 1796000000124, queue: protocol.DefaultQueue},
	}
	data := encodeCheckpoint(7, 99, heads)
	term, at, got, err := decodeCheckpoint(data)
	must(t, err)
	if term != 7 || at != 99 || len(got) != len(heads) {
		t.Fatalf("term %d at %d, %d heads", term, at, len(got))
	}
	for i := range heads {
		if got[i] != heads[i] {
			t.Fatalf("head %d: %+v, want %+v", i, got[i], heads[i])
		}
	}
	for n := range len(data) {
		if _, _, _, err := decodeCheckpoint(data[:n]); err == nil {
			t.Fatalf("a checkpoint cut to %d of %d bytes was read", n, len(data))
		}
	}
	if _, _, _, err := decodeCheckpoint(append([]byte("jobbus-index-3\n"), data[len(checkpointMagic):]...)); err == nil {
		t.Fatal("a checkpoint of another format was read")
	}
}

// TestCheckpointBetweenABindingAndItsRecord: on one server a job's finishing write is
// two messages, its idempotency binding and then, once that is stored, its record. A
// checkpoint whose stream sequence was read between the two, and whose copy of the
// index came before the record's acknowledgement (the job still active in it), replays
// the record but not the binding: the restart must still know the key, so that the
// submission sent again after the crash is answered with the job, not run again.
func TestCheckpointBetweenABindingAndItsRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, cfg, logs, start := restartable(t)
	cl := client.New(nc)
	submit := submitUnderKey(t, cl, "k")
	c1 := start(cfg)
	id := submit()
	index := c1.sched.indexCopy() // the job active, as the copy saw it
	_, _, err := cl.Cancel(ctx, id)
	must(t, err)
	st := c1.store.(*jsStore)
	bound, err := st.kv.Get(ctx, bindingKey("k"))
	must(t, err)
	rec, err := st.kv.Get(ctx, id)
	must(t, err)
	if bound.Revision() >= rec.Revision() {
		t.Fatalf("binding stored at %d, record at %d: the binding goes first", bound.Revision(), rec.Revision())
	}
	// The checkpoint the term would have written had its stream info been read with
	// the binding stored and not yet the record.
	_, err = st.ckpt.PutBytes(ctx, checkpointObject, encodeCheckpoint(c1.Term(), bound.Revision(), index))
	must(t, err)
	c1.ckpt.running.Store(true) // a crash: no checkpoint at the stop
	must(t, c1.Close())
	logs.Take()

	start(cfg)
	if !strings.Contains(logs.Take(), "recovering from a checkpoint") {
		t.Fatal("the checkpoint was not used")
	}
	if got := submit(); got != id {
		t.Fatalf("key %q names %s after the restart, want %s (cancelled before the crash)", "k", got, id)
	}
}

// submitUnderKey returns a submit of one SHA256 job under idempotency key k, which
// returns the id of the job the key names.
func submitUnderKey(t *testing.T, cl *client.Client, k string) func() string {
	return func() string {
		t.Helper()
		id, err := cl.Submit(context.Background(), "SHA256", map[string]string{"text": k}, client.IdempotencyKey(k))
		must(t, err)
		return id
	}
}

// TestKeyKeptForeverSurvivesRestart: with a retention of 0 a finished job and its
// idempotency key are kept for ever. A restart that reads the records (after a crash,
// with no checkpoint of the term) knows the key, as one that reads a checkpoint does:
// the submission sent again is answered with the job, not run again.
func TestKeyKeptForeverSurvivesRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, cfg, logs, start := restartable(t)
	cfg.Retention = 0
	cl := client.New(nc)
	submit := submitUnderKey(t, cl, "k")
	c1 := start(cfg)
	id := submit()
	_, _, err := cl.Cancel(ctx, id)
	must(t, err)
	c1.ckpt.running.Store(true) // a crash: no checkpoint at the stop
	must(t, c1.Close())
	logs.Take()

	start(cfg)
	if strings.Contains(logs.Take(), "recovering from a checkpoint") {
		t.Fatal("a checkpoint was used; none was written")
	}
	if got := submit(); got != id {
		t.Fatalf("key %q names %s after the restart, want %s (cancelled before it, kept for ever)", "k", got, id)
	}
}

// TestFarScheduledJobsKeepTheirQueue: a queue whose one job is SCHEDULED beyond the
// window, a job recovery knows by its entry only (never read whole), is known after a
// restart, so that it can be paused before the job comes due: from the checkpoint a
// graceful stop wrote, from the records' headers, and from a record written before
// SCHEDULED records named their queue (read whole). A name nothing used is refused.
func TestFarScheduledJobsKeepTheirQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, cfg, logs, start := restartable(t)
	cl := client.New(nc)
	pausable := func(when string, names ...string) {
		t.Helper()
		for _, name := range names {
			if _, err := cl.PauseQueue(ctx, name); err != nil {
				t.Errorf("%s: pause of queue %s, whose job is due in an hour: %v", when, name, err)
				continue
			}
			_, err := cl.ResumeQueue(ctx, name)
			must(t, err)
		}
		if _, err := cl.PauseQueue(ctx, "latr"); err == nil || !strings.Contains(err.Error(), "Unknown queue") {
			t.Errorf("%s: pause of a queue nothing used: %v, want Unknown queue", when, err)
		}
	}

	cold := func(c *Coordinator, id string) bool { // known by its entry only, not read whole
		c.sched.mu.Lock()
		defer c.sched.mu.Unlock()
		return c.sched.jobs[id] == nil
	}
	c1 := start(cfg)
	later, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "x"}, client.Queue("later"), client.RunIn(time.Hour))
	must(t, err)
	_, err = cl.Submit(ctx, "SHA256", map[string]string{"text": "y"}, client.RunIn(time.Hour)) // default
	must(t, err)
	must(t, c1.Close()) // a graceful stop writes the checkpoint
	logs.Take()

	c2 := start(cfg)
	if !strings.Contains(logs.Take(), "recovering from a checkpoint") {
		t.Fatal("the checkpoint written at the stop was not used")
	}
	pausable("from a checkpoint", "later")
	if !cold(c2, later) {
		t.Error("from a checkpoint: the job due in an hour is held whole")
	}
	c2.ckpt.running.Store(true) // no checkpoint at the stop
	must(t, c2.Close())

	// A record as a release before the queue header wrote it, of a job due in an hour.
	js, err := jetstream.New(nc)
	must(t, err)
	now := time.Now()
	old := protocol.Record{JobID: newID(), TaskType: "SHA256", Payload: json.RawMessage(`{"text":"old"}`),
		State: protocol.StateScheduled, MaxAttempts: 3, Priority: protocol.PriorityNormal, Seq: 1_000, CreatedAt: now.UnixMilli(), UpdatedAt: now.UnixMilli(),
		RunAt: now.Add(time.Hour).UnixMilli(), Queue: "old"}
	msg := nats.NewMsg(jobsSubjects + old.JobID)
	msg.Data, err = json.Marshal(&old)
	must(t, err)
	msg.Header.Set(protocol.HeaderSeq, "1000")
	msg.Header.Set(protocol.HeaderState, string(protocol.StateScheduled))
	msg.Header.Set(protocol.HeaderUniqueUntil, "0")
	msg.Header.Set(protocol.HeaderRunAt, strconv.FormatInt(old.RunAt, 10))
	_, err = js.PublishMsg(ctx, msg)
	must(t, err)

	full := cfg
	full.fullRecovery = true // the records' headers only
	c3 := start(full)
	pausable("from the records' headers", "later", "old")
	if !cold(c3, later) || !cold(c3, old.JobID) {
		t.Errorf("from the headers: the jobs due in an hour held whole: %v, %v", !cold(c3, later), !cold(c3, old.JobID))
	}
	if j, err := cl.Status(ctx, old.JobID); err != nil || j.State != protocol.StateScheduled {
		t.Fatalf("the older release's job: %+v %v, want SCHEDULED", j, err)
	}
	must(t, c3.Close()) // its checkpoint names the old job's queue too
	start(cfg)
	pausable("from a checkpoint, the older release's job read before", "later", "old")
}
