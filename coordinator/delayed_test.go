package coordinator

import (
	"context"
	"errors"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

func runIn(req *protocol.SubmitJob, d time.Duration) *protocol.SubmitJob {
	req.RunInMillis = d.Milliseconds()
	return req
}

// held reports whether job id is held whole in memory.
func (s *memSystem) held(id string) bool {
	s.sched.mu.Lock()
	defer s.sched.mu.Unlock()
	return s.sched.jobs[id] != nil
}

// TestFarScheduledJobsLeaveMemory: a SCHEDULED job due beyond the window is held by its
// index entry, due time and key only, once stored; it still counts, lists, answers its
// key and cancels; the warmer holds it whole again when it comes within the window,
// and it runs when due. A restart keeps it out of memory too.
func TestFarScheduledJobsLeaveMemory(t *testing.T) {
	b := newMemBackend()
	s := startMem(t, b, func(c *Config) { c.ScheduleWindow = time.Minute })
	b.now = s.clock.Now
	s.register("w", 1)
	far := s.accepted(withKey(runIn(sha("far"), time.Hour), "k"))
	gone := s.accepted(runIn(sha("gone"), 2*time.Hour))
	near := s.accepted(runIn(sha("near"), 30*time.Second))
	s.settle()
	if s.held(far) || s.held(gone) || !s.held(near) {
		t.Fatalf("held: far %v, gone %v, near %v; want the near job only", s.held(far), s.held(gone), s.held(near))
	}
	if n := s.c.Stats().Jobs[protocol.StateScheduled]; n != 3 || s.sched.delayed.scheduled != 3 {
		t.Fatalf("%d SCHEDULED jobs in the index, %d counted; want 3", n, s.sched.delayed.scheduled)
	}
	if snap := s.status(far); snap.State != protocol.StateScheduled || snap.RunAtMillis != s.clock.Now().Add(time.Hour).UnixMilli() {
		t.Fatalf("status of the far job: %+v", snap)
	}
	if again := s.accepted(withKey(runIn(sha("far"), time.Hour), "k")); again != far {
		t.Fatalf("its key answered %s, want %s", again, far)
	}
	if m, ok := s.cancel(gone).(*protocol.JobCancel); !ok || !m.Cancelled || m.Job.State != protocol.StateCancelled {
		t.Fatalf("cancel of a job out of memory: %#v", m)
	}
	s.settle()
	if n := s.c.Stats().Jobs[protocol.StateScheduled]; n != 2 || s.sched.delayed.scheduled != 2 {
		t.Fatalf("after a cancel: %d SCHEDULED in the counts, %d counted; want 2", n, s.sched.delayed.scheduled)
	}
	s.unfinishedAgree()

	next := startMem(t, b, func(c *Config) { c.ScheduleWindow = time.Minute })
	s.c.Close()
	next.register("w", 1)
	if next.held(far) || !next.held(near) || next.sched.delayed.scheduled != 2 {
		t.Fatalf("after a restart: held far %v near %v, %d SCHEDULED; want the near one held, 2", next.held(far), next.held(near), next.sched.delayed.scheduled)
	}
	next.sweep(31 * time.Second)
	a := next.assigned("w")
	if a.JobID != near {
		t.Fatalf("assigned %s, want the near job", a.JobID)
	}
	next.done("w", a)
	next.sweep(59 * time.Minute) // the far job comes within the window: read back
	eventuallyTrue(t, "the far job held again", func() bool { return next.held(far) })
	next.settle()
	if n := next.c.Stats().Jobs[protocol.StateScheduled]; n != 1 || next.sched.delayed.scheduled != 1 {
		t.Fatalf("held again: %d SCHEDULED in the counts, %d counted; want 1", n, next.sched.delayed.scheduled)
	}
	next.quiet()
	next.sweep(time.Minute)
	if a := next.assigned("w"); a.JobID != far {
		t.Fatalf("assigned %s, want the far job once due", a.JobID)
	}
	next.unfinishedAgree()
}

// eventuallyTrue polls cond for 10 s.
func eventuallyTrue(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkGCColdScheduledJobs is BenchmarkGCKeptJobs for SCHEDULED jobs due beyond the
// window: an index entry and a cold entry each, as a finished job has an index entry
// and an expiring entry.
func BenchmarkGCColdScheduledJobs(b *testing.B) {
	const n = 1_000_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var x jobIndex
	var d delayed
	for i := range n {
		x.add(uint64(i+1), newID(), protocol.StateScheduled, "", nil)
		d.cold = append(d.cold, coldEntry{at: int64(i), seq: uint64(i + 1)})
	}
	x.entries, d.cold = slices.Clip(x.entries), slices.Clip(d.cold)
	runtime.GC()
	runtime.ReadMemStats(&after)
	scan := []metrics.Sample{{Name: "/gc/scan/heap:bytes"}}
	metrics.Read(scan)
	for b.Loop() {
		runtime.GC()
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/job")
	b.ReportMetric(float64(after.HeapObjects-before.HeapObjects)/n, "objects/job")
	b.ReportMetric(float64(scan[0].Value.Uint64())/n, "scan-B/job")
	runtime.KeepAlive(&x)
	runtime.KeepAlive(&d)
}

// TestDelayedJobAgesFromItsDueTime: a delayed job keeps its priority and ages from when
// it came due, not from its submission: a LOW job delayed ten aging steps is still LOW
// when due, so a NORMAL job queued beside it goes first.
func TestDelayedJobAgesFromItsDueTime(t *testing.T) {
	s := startMem(t, nil) // aging step: a minute
	low := s.accepted(runIn(withPriority(sha("low"), protocol.PriorityLow), 10*time.Minute))
	s.sweep(10 * time.Minute) // read back (it was beyond the window), then due
	eventuallyTrue(t, "the delayed job held again", func() bool { return s.held(low) })
	s.sweep(0)
	if j := s.status(low); j.State != protocol.StateQueued || j.Priority != protocol.PriorityLow {
		t.Fatalf("due: %+v, want QUEUED, LOW", j)
	}
	normal := s.accepted(sha("normal"))
	s.register("w", 1)
	if a := s.assigned("w"); a.JobID != normal {
		t.Fatalf("assigned %s first, want the NORMAL job: the delayed LOW one aged from its submission", a.JobID)
	}
}

// heldCreate is a memStore whose first create waits until released and is then stored,
// or given up (fail) as a failing store gives up a create it could not store
// (jsStore.gaveUpCreate, refuseWaitingCreates).
type heldCreate struct {
	*memStore
	fail          bool
	held, release chan struct{}
	id            string // the held create's job
	once          sync.Once
}

func (s *heldCreate) write(ctx context.Context, ws []pendingWrite) bool {
	hold := false
	if len(ws) == 1 && ws[0].rev == 0 {
		s.once.Do(func() { hold = true })
	}
	if !hold {
		return s.memStore.write(ctx, ws)
	}
	s.id = ws[0].id
	close(s.held)
	<-s.release
	if !s.fail {
		return s.memStore.write(ctx, ws)
	}
	s.sink.giveUp(ws[0].j, errors.New("the store is failing"))
	return true
}

// TestDelayedJobComingDueWhileCreated: a job due just beyond the window comes within it
// while its create is in flight. If the create fails, its submitter hears so and the
// job is gone: when its time comes nothing is queued, stored or run. If it is stored,
// the job runs when due.
func TestDelayedJobComingDueWhileCreated(t *testing.T) {
	for _, fail := range []bool{true, false} {
		t.Run(map[bool]string{true: "CreateFails", false: "CreateStored"}[fail], func(t *testing.T) {
			delayedJobComingDueWhileCreated(t, fail)
		})
	}
}

// startHeld starts a coordinator on a heldCreate store (fail: its first create is given
// up once released) with a one-minute schedule window and worker "w" of one slot, runs
// before, and submits req, whose create is that first one: it returns once the create is held,
// with the channel its answer comes on.
func startHeld(t *testing.T, fail bool, req *protocol.SubmitJob, before ...func(*memSystem)) (*memSystem, *heldCreate, <-chan protocol.Message) {
	b := newMemBackend()
	clock := &testClock{now: time.UnixMilli(1_700_000_000_000)}
	b.now = clock.Now
	cfg := DefaultConfig()
	cfg.Now = clock.Now
	cfg.HeartbeatTimeout = time.Hour
	cfg.ScheduleWindow = time.Minute
	cfg.fill()
	st := &heldCreate{memStore: newMemStore(b), fail: fail, held: make(chan struct{}), release: make(chan struct{})}
	s := &memSystem{t: t, clock: clock, told: make(chan told, 1024)}
	s.c = &Coordinator{cfg: cfg}
	s.c.build(nil, st)
	s.sched = s.c.sched
	s.sched.link = s
	if _, err := s.c.open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.c.Close() })
	s.register("w", 1)
	for _, f := range before {
		f(s)
	}

	answer := make(chan protocol.Message, 1)
	s.sched.submit(req, request{due: cfg.ReplyWithin}, func(m protocol.Message) { answer <- answerOf(m) })
	select {
	case <-st.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the create never reached the store")
	}
	return s, st, answer
}

func delayedJobComingDueWhileCreated(t *testing.T, fail bool) {
	s, st, answer := startHeld(t, fail, runIn(sha("doomed"), time.Minute+10*time.Millisecond))
	b := st.memStore.b
	s.sweep(20 * time.Millisecond) // within the window now: the warmer runs
	close(st.release)
	select {
	case m := <-answer:
		if _, ok := m.(*protocol.JobSubmitted); ok == fail {
			t.Fatalf("submission answered %#v; its create failed: %v", m, fail)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to the submission")
	}
	// The answer goes before the job is armed (stored) or dropped (giveUp): wait for
	// that, or the clock could pass the due time before the job has its timer.
	s.settle()
	eventuallyTrue(t, "the create's outcome taken in", func() bool {
		s.sched.mu.Lock()
		defer s.sched.mu.Unlock()
		j := s.sched.jobs[st.id]
		if fail {
			return j == nil
		}
		return j != nil && j.answer == nil
	})
	s.sweep(time.Minute) // its time comes
	if !fail {
		if a := s.assigned("w"); a.JobID != st.id {
			t.Fatalf("assigned %s, want the delayed job %s once due", a.JobID, st.id)
		}
		return
	}
	s.quiet()
	b.mu.Lock()
	_, stored := b.records[st.id]
	b.mu.Unlock()
	s.sched.mu.Lock()
	active, scheduled := s.sched.active, s.sched.delayed.scheduled
	s.sched.mu.Unlock()
	if stored || active != 0 || scheduled != 0 {
		t.Fatalf("job %s, whose create failed: stored %v later, %d active and %d SCHEDULED counted; want none", st.id, stored, active, scheduled)
	}
}

// TestFailedCreateGivesItsTokenBack: a job assigned at once, whose create then fails,
// never started, so it gives back the rate limit's token it took: under a limit of one
// start an hour, the next job starts at once.
func TestFailedCreateGivesItsTokenBack(t *testing.T) {
	limit := func(s *memSystem) {
		m := s.sched.flow.setLimit(context.Background(), &protocol.SetLimit{Scope: protocol.LimitTaskType, Name: "SHA256", Rate: "1/h", Burst: 1})
		if _, ok := answerOf(m).(*protocol.LimitList); !ok {
			t.Fatalf("set limit: %#v", m)
		}
	}
	s, _, answer := startHeld(t, true, sha("doomed"), limit)
	close(s.sched.store.(*heldCreate).release)
	select {
	case m := <-answer:
		if _, ok := m.(*protocol.JobSubmitted); ok {
			t.Fatalf("submission answered %#v; its create failed", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to the submission")
	}
	s.settle()
	id := s.accepted(sha("next"))
	if a := s.assigned("w"); a.JobID != id {
		t.Fatalf("assigned %s, want the next job %s: the failed create's token is back", a.JobID, id)
	}
}

// TestJobQueuedAgainWhileCreatedIsQueuedOnce: a job assigned at once whose create stalls
// past its worker's loss and its backoff is QUEUED again before its create lands; the
// create landing does not queue it a second time. Otherwise its queue counts it twice,
// and, once it ran, shows a job queued that is not.
func TestJobQueuedAgainWhileCreatedIsQueuedOnce(t *testing.T) {
	s, st, answer := startHeld(t, false, sha("slow create"))
	s.sweep(time.Hour + time.Second) // the worker is lost (and the attempt's deadline passed)
	s.sweep(s.sched.cfg.RetryMaxDelay)
	s.sched.mu.Lock()
	j := s.sched.jobs[st.id]
	state := j.rec.State
	s.sched.mu.Unlock()
	if state != protocol.StateQueued {
		t.Fatalf("job %s before its create landed: %s, want QUEUED again", st.id, state)
	}
	close(st.release)
	if m := <-answer; m.(*protocol.JobSubmitted).JobID != st.id {
		t.Fatalf("submission answered %#v", m)
	}
	s.settle()
	if q := s.sched.queueList(); len(q) != 1 || q[0].Queued != 1 {
		t.Fatalf("queues %+v, want default with 1 job queued", q)
	}
	s.register("w2", 1)
	var a *protocol.TaskAssign
	for a == nil { // the lost attempt's TASK_CANCEL to w may come first
		a, _ = s.next().msg.(*protocol.TaskAssign)
	}
	s.done("w2", a)
	if q := s.sched.queueList(); len(q) != 1 || q[0].Queued != 0 {
		t.Fatalf("queues %+v once the job ran, want default with none queued", q)
	}
}
