package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/testkit"
)

// The contract every jobStore keeps (jobstore.go), run against each implementation:
// the in-memory one the lifecycle's tests use, and JetStream's in each of the ways it
// writes (pipelined, in atomic batches, and either wrapped by syncedStore). A backend
// makes stores over one shared storage: each store is a coordinator's, with a term of
// its own.
type storeBackend struct {
	name string
	// setup returns a function that opens a new store over storage shared by every
	// store it opens.
	setup func(t *testing.T) (newStore func() jobStore)
}

func storeBackends() []storeBackend {
	onJetStream := func(mods func(*Config), synced bool) func(t *testing.T) func() jobStore {
		return func(t *testing.T) func() jobStore {
			ctx := context.Background()
			srv, err := embeddednats.Start(ctx, embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Shutdown(ctx) })
			return func() jobStore {
				nc, err := srv.Connect()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nc.Close)
				cfg := DefaultConfig()
				if mods != nil {
					mods(&cfg)
				}
				cfg.fill()
				var s jobStore = newJetStreamStore(nc, &cfg)
				if synced {
					s = newSyncedStore(s, func() error { return nil }, &cfg)
				}
				return s
			}
		}
	}
	inMemory := func(synced bool) func(t *testing.T) func() jobStore {
		return func(t *testing.T) func() jobStore {
			b := newMemBackend()
			return func() jobStore {
				var s jobStore = newMemStore(b)
				if synced {
					cfg := DefaultConfig()
					cfg.fill()
					s = newSyncedStore(s, func() error { return nil }, &cfg)
				}
				return s
			}
		}
	}
	batched := func(c *Config) { c.SyncAlways = true }
	return []storeBackend{
		{name: "Memory", setup: inMemory(false)},
		{name: "MemorySynced", setup: inMemory(true)},
		{name: "JetStreamPipelined", setup: onJetStream(nil, false)},
		{name: "JetStreamBatched", setup: onJetStream(batched, false)},
		{name: "JetStreamPipelinedSynced", setup: onJetStream(nil, true)},
		{name: "JetStreamBatchedSynced", setup: onJetStream(batched, true)},
	}
}

// TestJobStoreContract runs the contract against every backend. It is not parallel
// with the package's other tests: it runs (its backends side by side) before the
// lifecycle suite's tests, whose heartbeat timeouts are short, rather than beside them.
func TestJobStoreContract(t *testing.T) {
	cases := []struct {
		name string
		test func(t *testing.T, newStore func() jobStore)
	}{
		{"CreatesAndReadsBack", testStoreCreatesAndReadsBack},
		{"UpdatesAreCASOnTheRevision", testStoreUpdatesAreCAS},
		{"NewTermFencesTheOldOne", testStoreNewTermFences},
		{"LoadsWhatWasWritten", testStoreLoads},
		{"ChecksPointsTheIndex", testStoreCheckpoints},
		{"ReadsBackWithTheRevision", testStoreReadsBackWithTheRevision},
		{"ControlsAreCASOnTheRevision", testStoreControls},
		{"ControlWritesAreSettledByReadingBack", testStoreWriteControl},
	}
	for _, b := range storeBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) { tc.test(t, b.setup(t)) })
			}
		})
	}
}

// recordingSink is a storeSink that remembers every outcome.
type recordingSink struct {
	mu      sync.Mutex
	revs    map[*job]uint64
	errs    map[*job]error
	gaveUp  map[*job]error
	fenced  []error
	refused atomic.Int32
	doubted map[*job]bool
}

func newRecordingSink() *recordingSink {
	return &recordingSink{revs: make(map[*job]uint64), errs: make(map[*job]error), gaveUp: make(map[*job]error), doubted: make(map[*job]bool)}
}

func (r *recordingSink) doubt(ws []pendingWrite) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ws {
		r.doubted[w.j] = true
	}
}

func (r *recordingSink) inDoubt(ws []pendingWrite) []pendingWrite {
	r.mu.Lock()
	defer r.mu.Unlock()
	var in []pendingWrite
	for _, w := range ws {
		if r.doubted[w.j] {
			in = append(in, w)
		}
	}
	return in
}

func (r *recordingSink) settle(ws []pendingWrite) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ws {
		delete(r.doubted, w.j)
	}
}

func (r *recordingSink) hurry([]pendingWrite, string) {}

func (r *recordingSink) doubts() writeDoubts { return r }

func (r *recordingSink) written(j *job, rev, _ uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revs[j] = rev
}

func (r *recordingSink) writtenAll(ws []ackedWrite) {
	for _, w := range ws {
		r.written(w.j, w.rev, w.version)
	}
}

func (r *recordingSink) fail(j *job, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs[j] = err
}

func (r *recordingSink) giveUp(j *job, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gaveUp[j] = err
}

func (r *recordingSink) refuseWaitingCreates(error) { r.refused.Add(1) }

func (r *recordingSink) fence(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fenced = append(r.fenced, err)
}

// outcome waits for j's write to end: its revision, or its error.
func (r *recordingSink) outcome(t *testing.T, j *job) (uint64, error) {
	t.Helper()
	var rev uint64
	var err error
	testkit.Eventually(t, 20*time.Second, "write of job "+j.rec.JobID+" ended", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		var ok bool
		if rev, ok = r.revs[j]; ok {
			delete(r.revs, j)
			return true
		}
		if err, ok = r.errs[j]; ok {
			delete(r.errs, j)
			return true
		}
		err, ok = r.gaveUp[j]
		return ok
	})
	return rev, err
}

// startStore opens s and starts it writing to a new recording sink, until the test ends.
func startStore(t *testing.T, s jobStore) *recordingSink {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.open(ctx); err != nil {
		t.Fatal(err)
	}
	sink := newRecordingSink()
	if err := s.start(ctx, sink); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); s.wait() })
	return sink
}

// testWrite is a write of a job record in state st over revision rev; a finished
// one is kept for retention, with its binding if key is set.
func testWrite(t *testing.T, j *job, rev uint64, st protocol.State, key string) pendingWrite {
	t.Helper()
	j.rec.State, j.rec.IdempotencyKey = st, key
	j.version++
	data, err := j.rec.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	w := pendingWrite{j: j, id: j.rec.JobID, key: key, data: data, rev: rev, version: j.version, seq: j.rec.Seq, state: st,
		bind: binding{JobID: j.rec.JobID, Fingerprint: "fp-" + key}}
	if st.Terminal() {
		w.ttl, w.expires = time.Hour, time.Now().Add(time.Hour).UnixMilli()
	}
	return w
}

var testSeq atomic.Uint64

func testJob() *job {
	return &job{rec: protocol.Record{JobID: newID(), TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`),
		MaxAttempts: 3, Priority: protocol.PriorityNormal, Seq: testSeq.Add(1), CreatedAt: time.Now().UnixMilli()}}
}

func readRecord(t *testing.T, s jobStore, id string) protocol.Record {
	t.Helper()
	data, err := s.read(context.Background(), id)
	if err != nil {
		t.Fatalf("read %s: %v", id, err)
	}
	var r protocol.Record
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func testStoreCreatesAndReadsBack(t *testing.T, newStore func() jobStore) {
	s := newStore()
	sink := startStore(t, s)
	if prev, term := s.terms(); term != 1 || prev != 0 {
		t.Fatalf("the first store's terms: %d after %d, want 1 after 0", term, prev)
	}
	jobs := []*job{testJob(), testJob(), testJob()}
	var ws []pendingWrite
	for _, j := range jobs {
		ws = append(ws, testWrite(t, j, 0, protocol.StateQueued, ""))
	}
	if !s.write(context.Background(), ws) {
		t.Fatal("write refused with a live context")
	}
	seen := map[uint64]bool{}
	for _, j := range jobs {
		rev, err := sink.outcome(t, j)
		if err != nil || rev == 0 || seen[rev] {
			t.Fatalf("create of %s: revision %d, %v; want a new revision", j.rec.JobID, rev, err)
		}
		seen[rev] = true
		if r := readRecord(t, s, j.rec.JobID); r.JobID != j.rec.JobID || r.State != protocol.StateQueued || r.Seq != j.rec.Seq {
			t.Fatalf("read back %+v, want job %s QUEUED at %d", r, j.rec.JobID, j.rec.Seq)
		}
	}
	if _, err := s.read(context.Background(), newID()); !errors.Is(err, errNoRecord) {
		t.Fatalf("read of a job never written: %v, want errNoRecord", err)
	}
}

func testStoreUpdatesAreCAS(t *testing.T, newStore func() jobStore) {
	s := newStore()
	sink := startStore(t, s)
	ctx := context.Background()
	j := testJob()
	s.write(ctx, []pendingWrite{testWrite(t, j, 0, protocol.StateQueued, "")})
	rev1, err := sink.outcome(t, j)
	if err != nil {
		t.Fatal(err)
	}
	s.write(ctx, []pendingWrite{testWrite(t, j, rev1, protocol.StateRunning, "")})
	rev2, err := sink.outcome(t, j)
	if err != nil || rev2 <= rev1 {
		t.Fatalf("update over %d: revision %d, %v; want a later one", rev1, rev2, err)
	}
	if r := readRecord(t, s, j.rec.JobID); r.State != protocol.StateRunning {
		t.Fatalf("read back %s, want RUNNING", r.State)
	}
	// A write over a revision that is no longer the last: someone else wrote it.
	s.write(ctx, []pendingWrite{testWrite(t, j, rev1, protocol.StateCompleted, "")})
	if _, err := sink.outcome(t, j); !errors.Is(err, ErrFenced) {
		t.Fatalf("update over a stale revision: %v, want ErrFenced", err)
	}
	testkit.Eventually(t, 5*time.Second, "the sink fenced", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return len(sink.fenced) > 0
	})
	if r := readRecord(t, s, j.rec.JobID); r.State != protocol.StateRunning {
		t.Fatalf("a refused update changed the record to %s", r.State)
	}
}

func testStoreNewTermFences(t *testing.T, newStore func() jobStore) {
	ctx := context.Background()
	old := newStore()
	oldSink := startStore(t, old)
	j := testJob()
	old.write(ctx, []pendingWrite{testWrite(t, j, 0, protocol.StateQueued, "")})
	if _, err := oldSink.outcome(t, j); err != nil {
		t.Fatal(err)
	}

	next := newStore()
	nextSink := startStore(t, next)
	_, oldTerm := old.terms()
	if prev, term := next.terms(); prev != oldTerm || term != oldTerm+1 {
		t.Fatalf("the next store's terms: %d after %d, want %d after %d", term, prev, oldTerm+1, oldTerm)
	}
	// The deposed store can create nothing, not even a finished job's binding.
	for _, w := range []pendingWrite{testWrite(t, testJob(), 0, protocol.StateQueued, ""), testWrite(t, testJob(), 0, protocol.StateCompleted, "k")} {
		old.write(ctx, []pendingWrite{w})
		if _, err := oldSink.outcome(t, w.j); !errors.Is(err, ErrFenced) {
			t.Fatalf("create by a deposed store: %v, want ErrFenced", err)
		}
		if _, err := old.read(ctx, w.id); !errors.Is(err, errNoRecord) {
			t.Fatalf("a deposed store's create landed: %v", err)
		}
	}
	// The new one creates, and updates what the old one wrote.
	n := testJob()
	next.write(ctx, []pendingWrite{testWrite(t, n, 0, protocol.StateQueued, "")})
	if _, err := nextSink.outcome(t, n); err != nil {
		t.Fatalf("create by the new term: %v", err)
	}
}

func testStoreLoads(t *testing.T, newStore func() jobStore) {
	ctx := context.Background()
	s := newStore()
	sink := startStore(t, s)
	active, done := testJob(), testJob()
	s.write(ctx, []pendingWrite{testWrite(t, active, 0, protocol.StateQueued, "")})
	activeRev, err := sink.outcome(t, active)
	if err != nil {
		t.Fatal(err)
	}
	s.write(ctx, []pendingWrite{testWrite(t, done, 0, protocol.StateQueued, "key-1")})
	rev, err := sink.outcome(t, done)
	if err != nil {
		t.Fatal(err)
	}
	s.write(ctx, []pendingWrite{testWrite(t, done, rev, protocol.StateCompleted, "key-1")})
	doneRev, err := sink.outcome(t, done)
	if err != nil {
		t.Fatal(err)
	}

	next := newStore()
	startStore(t, next)
	ld, err := next.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ld.lastSeq <= doneRev {
		t.Fatalf("last sequence %d, want above the last write's %d (the new term is a write too)", ld.lastSeq, doneRev)
	}
	heads := map[string]head{}
	for _, h := range ld.heads {
		heads[h.id] = h
	}
	if h, ok := heads[done.rec.JobID]; !ok || h.state != protocol.StateCompleted || h.seq != done.rec.Seq || h.expires == 0 {
		t.Fatalf("the finished job's head: %+v (found %v), want COMPLETED at %d with its end of retention", h, ok, done.rec.Seq)
	}
	if _, ok := heads[active.rec.JobID]; !ok {
		t.Fatalf("no head for the active job: %+v", ld.heads)
	}
	if len(ld.records) != 1 || ld.records[0].JobID != active.rec.JobID || ld.records[0].rev != activeRev || ld.records[0].State != protocol.StateQueued {
		t.Fatalf("records read whole: %+v, want the active job alone at revision %d", ld.records, activeRev)
	}
	bound := map[string]binding{}
	err = next.bindings(ctx, true, func(key string, value []byte) bool {
		var b binding
		if err := json.Unmarshal(value, &b); err != nil {
			t.Errorf("binding %s: %v", key, err)
		}
		bound[key] = b
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if b := bound[bindingKey("key-1")]; b.JobID != done.rec.JobID || b.Fingerprint != "fp-key-1" {
		t.Fatalf("bindings %+v, want key-1 bound to job %s", bound, done.rec.JobID)
	}
}

func testStoreCheckpoints(t *testing.T, newStore func() jobStore) {
	s := newStore()
	startStore(t, s)
	ctx := context.Background()
	heads := []head{{id: newID(), seq: 1, state: protocol.StateCompleted}, {id: newID(), seq: 2}}
	n, err := s.checkpoint(ctx, func() []head { return heads })
	if err != nil || n != len(heads) {
		t.Fatalf("checkpoint: %d jobs, %v; want %d", n, err, len(heads))
	}
	// A coordinator fenced meanwhile copies nothing, and nothing is written.
	if n, err := s.checkpoint(ctx, func() []head { return nil }); err != nil || n != 0 {
		t.Fatalf("checkpoint of nothing: %d jobs, %v", n, err)
	}
}

// testStoreReadsBackWithTheRevision: readAt returns what the last write of a record
// stored and the revision that write reported (what a write whose outcome is unknown
// is read back with, outcome.go), and errNoRecord for a record never written.
func testStoreReadsBackWithTheRevision(t *testing.T, newStore func() jobStore) {
	s := newStore()
	sink := startStore(t, s)
	ctx := context.Background()
	j := testJob()
	create := testWrite(t, j, 0, protocol.StateQueued, "")
	s.write(ctx, []pendingWrite{create})
	rev1, err := sink.outcome(t, j)
	if err != nil {
		t.Fatal(err)
	}
	data, rev, err := s.readAt(ctx, j.rec.JobID)
	if err != nil || rev != rev1 || !bytes.Equal(data, create.data) {
		t.Fatalf("read back after the create: revision %d, %v, %q; want revision %d and %q", rev, err, data, rev1, create.data)
	}
	update := testWrite(t, j, rev1, protocol.StateRunning, "")
	s.write(ctx, []pendingWrite{update})
	rev2, err := sink.outcome(t, j)
	if err != nil {
		t.Fatal(err)
	}
	data, rev, err = s.readAt(ctx, j.rec.JobID)
	if err != nil || rev != rev2 || rev2 <= rev1 || !bytes.Equal(data, update.data) {
		t.Fatalf("read back after the update: revision %d, %v, %q; want revision %d (> %d) and %q", rev, err, data, rev2, rev1, update.data)
	}
	if _, rev, err := s.readAt(ctx, newID()); !errors.Is(err, errNoRecord) || rev != 0 {
		t.Fatalf("read back of a job never written: revision %d, %v; want errNoRecord", rev, err)
	}
}

// Controls are created once, replaced and removed only at the revision last read, and
// listed by prefix, in key order, by whoever opens the store next.
func testStoreControls(t *testing.T, newStore func() jobStore) {
	ctx := context.Background()
	s := newStore()
	startStore(t, s)
	c := s.controls()
	rev, err := c.put(ctx, "queue.low", []byte(`{"paused":true}`), 0)
	if err != nil || rev == 0 {
		t.Fatalf("create: revision %d, %v", rev, err)
	}
	if _, err := c.put(ctx, "queue.low", []byte(`{}`), 0); !errors.Is(err, errControlChanged) {
		t.Fatalf("a second create: %v, want errControlChanged", err)
	}
	rev2, err := c.put(ctx, "queue.low", []byte(`{"paused":false}`), rev)
	if err != nil || rev2 <= rev {
		t.Fatalf("update at the revision read: %d, %v", rev2, err)
	}
	if _, err := c.put(ctx, "queue.low", []byte(`{}`), rev); !errors.Is(err, errControlChanged) {
		t.Fatalf("update at a stale revision: %v, want errControlChanged", err)
	}
	if _, err := c.put(ctx, "queue.critical", []byte(`{"maxRunning":2}`), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.put(ctx, "limit.type.SHA256", []byte(`{}`), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.remove(ctx, "queue.critical", rev); !errors.Is(err, errControlChanged) {
		t.Fatalf("remove at a stale revision: %v, want errControlChanged", err)
	}

	next := newStore() // the next leader reads them back
	startStore(t, next)
	got, err := next.controls().list(ctx, "queue.")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].key != "queue.critical" || got[1].key != "queue.low" ||
		string(got[1].value) != `{"paused":false}` || got[1].rev != rev2 {
		t.Fatalf("listed %+v, want queue.critical then queue.low at revision %d", got, rev2)
	}
	if err := next.controls().remove(ctx, "queue.critical", got[0].rev); err != nil {
		t.Fatal(err)
	}
	if err := next.controls().remove(ctx, "queue.gone", 0); err != nil {
		t.Fatalf("removing what is not there: %v", err)
	}
	if got, _ := next.controls().list(ctx, "queue."); len(got) != 1 || got[0].key != "queue.low" {
		t.Fatalf("after remove: %+v, want queue.low only", got)
	}
}

// lossyControls is a store's controls whose writes' answers may be lost, as to a
// timeout or a dropped connection.
type lossyControls struct {
	controlStore
	lose   bool // a write's answer is lost
	landed bool // ... after the write reached the store (false: it never did)
	unread bool // reading back fails
}

var errAnswerLost = fmt.Errorf("the answer never came: %w", context.DeadlineExceeded)

func (c lossyControls) put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if !c.lose || c.landed {
		got, err := c.controlStore.put(ctx, key, value, rev)
		if err != nil || !c.lose {
			return got, err
		}
	}
	return 0, errAnswerLost
}

func (c lossyControls) remove(ctx context.Context, key string, rev uint64) error {
	if !c.lose || c.landed {
		if err := c.controlStore.remove(ctx, key, rev); err != nil || !c.lose {
			return err
		}
	}
	return errAnswerLost
}

func (c lossyControls) get(ctx context.Context, key string) (control, bool, error) {
	if c.unread {
		return control{}, false, errors.New("read back: connection closed")
	}
	return c.controlStore.get(ctx, key)
}

// writeControl settles a write whose answer was lost by reading the setting back: one
// that landed (or landed earlier, sent again at the revision it was sent at) is
// reported landed at the revision stored; one not stored yet may still be (a cluster's
// leader may commit it later), so it is errControlUnknown, as is one that cannot be
// read back; one that meets another's write is a conflict (errControlChanged) naming
// what is stored.
func testStoreWriteControl(t *testing.T, newStore func() jobStore) {
	ctx := context.Background()
	s := newStore()
	startStore(t, s)
	store := s.controls()
	const (
		landed   = "landed"
		conflict = "conflict"
		unknown  = "unknown"
	)
	v1, v2, theirs := []byte(`{"paused":true}`), []byte(`{"paused":false}`), []byte(`{"maxRunning":3}`)
	cases := []struct {
		name         string
		exists       bool   // the key holds v1 at the revision written with
		value        []byte // what is written: nil, the removal
		sentBefore   bool   // value was written at that revision once already, its answer lost
		theirs       bool   // another wrote theirs since
		lose, landed bool   // lossyControls': the write's answer is lost, after it landed
		unread       bool   // lossyControls': reading back fails
		want         string
	}{
		{name: "a create that landed, its answer lost", value: v2, lose: true, landed: true, want: landed},
		{name: "an update that landed, its answer lost", exists: true, value: v2, lose: true, landed: true, want: landed},
		{name: "a removal that landed, its answer lost", exists: true, lose: true, landed: true, want: landed},
		{name: "an update sent again after its answer was lost", exists: true, value: v2, sentBefore: true, want: landed},
		{name: "a removal sent again after its answer was lost", exists: true, sentBefore: true, want: landed},
		{name: "a create not stored yet, its answer lost", value: v2, lose: true, want: unknown},
		{name: "an update not stored yet, its answer lost", exists: true, value: v2, lose: true, want: unknown},
		{name: "a removal not done yet, its answer lost", exists: true, lose: true, want: unknown},
		{name: "an update at a stale revision", exists: true, value: v2, theirs: true, want: conflict},
		{name: "a create of a key taken", value: v2, theirs: true, want: conflict},
		{name: "a removal at a stale revision", exists: true, theirs: true, want: conflict},
		{name: "an update lost, and another's landed", exists: true, value: v2, theirs: true, lose: true, want: conflict},
		{name: "an update at a stale revision, not read back", exists: true, value: v2, theirs: true, unread: true, want: conflict},
		{name: "an update whose answer and read back are lost", exists: true, value: v2, lose: true, landed: true, unread: true, want: unknown},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("queue.settled%d", i)
			var rev uint64
			if tc.exists {
				var err error
				if rev, err = store.put(ctx, key, v1, 0); err != nil {
					t.Fatal(err)
				}
			}
			if tc.sentBefore {
				if _, err := writeControl(ctx, store, key, tc.value, rev); err != nil {
					t.Fatal(err)
				}
			}
			var theirRev uint64
			if tc.theirs {
				var err error
				if theirRev, err = store.put(ctx, key, theirs, rev); err != nil {
					t.Fatal(err)
				}
			}
			before, _, err := store.get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			cs := lossyControls{controlStore: store, lose: tc.lose, landed: tc.landed, unread: tc.unread}
			got, err := writeControl(ctx, cs, key, tc.value, rev)
			now, stored, rerr := store.get(ctx, key)
			if rerr != nil {
				t.Fatal(rerr)
			}
			switch tc.want {
			case landed:
				if err != nil {
					t.Fatalf("write: %v, want it landed", err)
				}
				if tc.value == nil && (stored || got != 0) {
					t.Fatalf("removal landed at revision %d, stored now %+v (%t); want none", got, now, stored)
				}
				if tc.value != nil && (!stored || got != now.rev || got <= rev || !bytes.Equal(now.value, tc.value)) {
					t.Fatalf("landed at revision %d; stored %q at %d (%t), want %q at that revision, above %d", got, now.value, now.rev, stored, tc.value, rev)
				}
			case conflict:
				if !errors.Is(err, errControlChanged) || errors.Is(err, errControlUnknown) || got != 0 {
					t.Fatalf("write: revision %d, %v; want errControlChanged", got, err)
				}
				if !stored || now.rev != theirRev || !bytes.Equal(now.value, theirs) {
					t.Fatalf("after a conflict, stored %q at %d (%t); want theirs untouched: %q at %d", now.value, now.rev, stored, theirs, theirRev)
				}
				var changed *controlChanged
				if !tc.unread && (!errors.As(err, &changed) || changed.stored == nil || changed.stored.rev != theirRev || !bytes.Equal(changed.stored.value, theirs)) {
					t.Fatalf("conflict %v does not say what is stored (%q at %d)", err, theirs, theirRev)
				}
			case unknown:
				if !errors.Is(err, errControlUnknown) || errors.Is(err, errControlChanged) || !errors.Is(err, errAnswerLost) {
					t.Fatalf("write: %v, want errControlUnknown wrapping the write's error", err)
				}
				if !tc.landed && (stored != tc.exists || now.rev != before.rev || !bytes.Equal(now.value, before.value)) {
					t.Fatalf("after a write not landed, stored %q at %d (%t); want what was: %q at %d", now.value, now.rev, stored, before.value, before.rev)
				}
			}
		})
	}
	if _, ok, err := store.get(ctx, "queue.never"); ok || err != nil {
		t.Fatalf("get of a key never written: %t, %v; want not stored and no error", ok, err)
	}
}

// Both codes JetStream answers a wrong expected revision with are a CAS conflict: a
// replicated stream's atomic batch uses its own.
func TestWrongLastSequenceCodes(t *testing.T) {
	for _, code := range []jetstream.ErrorCode{jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant} {
		err := fmt.Errorf("publish: %w", &jetstream.APIError{ErrorCode: code})
		if !wrongLastSequence(err) || !isCASConflict(err) {
			t.Errorf("code %d is not taken for a wrong last sequence", code)
		}
	}
	if wrongLastSequence(&jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamNotFound}) {
		t.Error("stream not found taken for a wrong last sequence")
	}
}
