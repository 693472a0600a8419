package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// The scheduling rules of PROTOCOL.md (priority with aging, admission, retries and
// their backoff, deadlines, cancellation, idempotency, recovery), tested on a
// coordinator over the in-memory store (memstore.go) with no NATS: its clock is the
// test's, what it tells workers is recorded, and the sweeper runs when a test says.
// They take milliseconds; they are not parallel, so that they run before the
// lifecycle suite's tests (whose heartbeat timeouts are short) rather than beside them.

// testClock is a clock that moves only when told.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// told is a message the coordinator sent a worker.
type told struct {
	worker string
	path   string
	msg    any
}

// memSystem is a coordinator over the in-memory store, with what it told workers.
type memSystem struct {
	t     *testing.T
	c     *Coordinator
	sched *scheduler
	clock *testClock
	told  chan told
}

func (s *memSystem) Tell(_ context.Context, to bus.Address, path string, msg any) error {
	s.told <- told{worker: to.ID, path: path, msg: msg}
	return nil
}

// startMem starts a coordinator over b (a new backend if nil), configured by mods.
func startMem(t *testing.T, b *memBackend, mods ...func(*Config)) *memSystem {
	t.Helper()
	clock := &testClock{now: time.UnixMilli(1_700_000_000_000)}
	if b == nil {
		b = newMemBackend()
		b.now = clock.Now
	} else if b.now != nil {
		clock.now = b.now()
		b.now = clock.Now
	}
	cfg := DefaultConfig()
	cfg.Now = clock.Now
	cfg.HeartbeatTimeout = time.Hour // the sweeper loses no worker unless a test says so
	for _, m := range mods {
		m(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.fill()
	s := &memSystem{t: t, clock: clock, told: make(chan told, 1024)}
	s.c = &Coordinator{cfg: cfg}
	s.c.build(nil, newMemStore(b))
	s.sched = s.c.sched
	s.sched.link = s
	if _, err := s.c.open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.c.Close() })
	return s
}

// submit submits req and waits for the answer.
func (s *memSystem) submit(req *protocol.SubmitJob) protocol.Message {
	s.t.Helper()
	got := make(chan protocol.Message, 1)
	s.sched.submit(req, request{due: s.sched.cfg.ReplyWithin}, func(m protocol.Message) { got <- answerOf(m) })
	select {
	case m := <-got:
		return m
	case <-time.After(10 * time.Second):
		s.t.Fatal("no answer to a submission")
		return nil
	}
}

// answerOf is the answer a client gets for reply m: a reply that states what is stored
// (settled) goes as its message (api.endpoint).
func answerOf(m protocol.Message) protocol.Message {
	m, _ = unsettle(m)
	return m
}

func sha(text string) *protocol.SubmitJob {
	return &protocol.SubmitJob{TaskType: "SHA256", Payload: json.RawMessage(`{"text":"` + text + `"}`)}
}

func withPriority(req *protocol.SubmitJob, p protocol.Priority) *protocol.SubmitJob {
	req.Priority = &p
	return req
}

func withKey(req *protocol.SubmitJob, key string) *protocol.SubmitJob {
	req.IdempotencyKey = &key
	return req
}

// accepted submits req and returns the job's id.
func (s *memSystem) accepted(req *protocol.SubmitJob) string {
	s.t.Helper()
	m := s.submit(req)
	ok, isOK := m.(*protocol.JobSubmitted)
	if !isOK {
		s.t.Fatalf("submission answered %#v, want JOB_SUBMITTED", m)
	}
	return ok.JobID
}

func (s *memSystem) register(id string, capacity int) {
	s.t.Helper()
	if _, err := s.sched.reg.register(&protocol.WorkerRegister{WorkerID: id, Capacity: capacity}); err != nil {
		s.t.Fatal(err)
	}
}

// next returns the next message told to a worker.
func (s *memSystem) next() told {
	s.t.Helper()
	select {
	case m := <-s.told:
		return m
	case <-time.After(10 * time.Second):
		s.t.Fatal("nothing told to any worker")
		return told{}
	}
}

// assigned returns the next TASK_ASSIGN, to worker.
func (s *memSystem) assigned(worker string) *protocol.TaskAssign {
	s.t.Helper()
	m := s.next()
	a, ok := m.msg.(*protocol.TaskAssign)
	if !ok || m.worker != worker {
		s.t.Fatalf("told %s %#v, want a TASK_ASSIGN to %s", m.worker, m.msg, worker)
	}
	return a
}

// quiet checks that nothing was told to a worker, once the writes decided have landed.
func (s *memSystem) quiet() {
	s.t.Helper()
	s.settle()
	select {
	case m := <-s.told:
		s.t.Fatalf("told %s %#v, want nothing", m.worker, m.msg)
	default:
	}
}

// settle waits until no write is in flight.
func (s *memSystem) settle() {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.sched.mu.Lock()
		busy := s.sched.wq.writes > 0
		s.sched.mu.Unlock()
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatal("writes still in flight")
		}
		time.Sleep(time.Millisecond)
	}
}

// result reports an attempt's outcome and waits for the acknowledgement.
func (s *memSystem) result(worker string, a *protocol.TaskAssign, success, permanent bool, text string) (protocol.ResultAck, error) {
	s.t.Helper()
	res := &protocol.TaskResult{WorkerID: worker, JobID: a.JobID, AttemptID: a.AttemptID, Success: success, Permanent: permanent}
	if success {
		res.Result = &text
	} else {
		res.Error = &text
	}
	type answer struct {
		ack protocol.ResultAck
		err error
	}
	got := make(chan answer, 1)
	s.sched.result(res, func(ack protocol.ResultAck, err error) { got <- answer{ack, err} })
	select {
	case a := <-got:
		return a.ack, a.err
	case <-time.After(10 * time.Second):
		s.t.Fatal("no acknowledgement of a result")
		return protocol.ResultAck{}, nil
	}
}

// done completes an attempt.
func (s *memSystem) done(worker string, a *protocol.TaskAssign) {
	s.t.Helper()
	if ack, err := s.result(worker, a, true, false, "ok"); err != nil || !ack.Accepted {
		s.t.Fatalf("result of %s: %+v, %v", a.JobID, ack, err)
	}
}

func (s *memSystem) status(id string) protocol.Job {
	s.t.Helper()
	s.settle()
	snap, err := s.sched.snapshot(id)
	if err != nil {
		s.t.Fatalf("status of %s: %v", id, err)
	}
	return snap
}

// sweep runs the sweeper once, after moving the clock by d.
func (s *memSystem) sweep(d time.Duration) {
	s.clock.advance(d)
	s.sched.sweep()
}

func (s *memSystem) cancel(id string) protocol.Message {
	s.t.Helper()
	got := make(chan protocol.Message, 1)
	s.sched.cancelJob(id, s.sched.cfg.ReplyWithin, func(m protocol.Message) { got <- answerOf(m) })
	select {
	case m := <-got:
		return m
	case <-time.After(10 * time.Second):
		s.t.Fatal("no answer to a cancel")
		return nil
	}
}

func TestSchedulingPriorityWithAging(t *testing.T) {
	s := startMem(t, nil, func(c *Config) { c.AgingStep = time.Minute })
	old := s.accepted(withPriority(sha("old"), protocol.PriorityLow))
	s.clock.advance(2 * time.Minute) // two steps: LOW ages to HIGH
	normal := s.accepted(withPriority(sha("normal"), protocol.PriorityNormal))
	high := s.accepted(withPriority(sha("high"), protocol.PriorityHigh))
	low := s.accepted(withPriority(sha("low"), protocol.PriorityLow))
	s.register("w1", 1)
	var order []string
	for range 4 {
		a := s.assigned("w1")
		order = append(order, a.JobID)
		s.done("w1", a)
	}
	want := []string{old, high, normal, low} // the aged job ties HIGH and is older
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Fatalf("assigned in order %v, want %v (old, high, normal, low)", order, want)
	}
}

func TestSchedulingAdmission(t *testing.T) {
	s := startMem(t, nil, func(c *Config) { c.MaxActiveJobs = 2 })
	first := s.accepted(withKey(sha("a"), "a"))
	s.accepted(sha("b"))
	rej, ok := s.submit(sha("c")).(*protocol.SubmitRejected)
	if !ok || rej.ActiveCount != 2 || rej.Limit != 2 {
		t.Fatalf("a third active job: %#v, want SUBMIT_REJECTED at 2 of 2", rej)
	}
	// A duplicate needs no room: it is the same job.
	if id := s.accepted(withKey(sha("a"), "a")); id != first {
		t.Fatalf("a duplicate at capacity: job %s, want %s", id, first)
	}
	s.register("w1", 1)
	s.done("w1", s.assigned("w1"))
	s.accepted(sha("c")) // a job finished: room again
}

func TestSchedulingRetriesWithBackoff(t *testing.T) {
	s := startMem(t, nil, func(c *Config) {
		c.MaxAttempts, c.RetryBaseDelay, c.RetryMaxDelay = 4, time.Second, 3*time.Second
	})
	s.register("w1", 1)
	id := s.accepted(sha("x"))
	for attempt, delay := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} { // doubling, capped
		a := s.assigned("w1")
		if a.JobID != id || a.AttemptNumber != attempt+1 {
			t.Fatalf("assigned job %s attempt %d, want job %s attempt %d", a.JobID, a.AttemptNumber, id, attempt+1)
		}
		if ack, err := s.result("w1", a, false, false, "boom"); err != nil || !ack.Accepted {
			t.Fatalf("failure of attempt %d: %+v, %v", attempt+1, ack, err)
		}
		snap := s.status(id)
		if snap.State != protocol.StateRetryWait || deref(snap.Error) != "boom" {
			t.Fatalf("after a failed attempt: %s (%q), want RETRY_WAIT (boom)", snap.State, deref(snap.Error))
		}
		s.sweep(delay - time.Millisecond)
		s.quiet() // not yet due
		s.sweep(time.Millisecond)
	}
	a := s.assigned("w1")
	if _, err := s.result("w1", a, false, false, "boom"); err != nil {
		t.Fatal(err)
	}
	if snap := s.status(id); snap.State != protocol.StateFailed || !strings.Contains(deref(snap.Error), "(all 4 attempts used)") {
		t.Fatalf("after the last attempt: %s (%q), want FAILED, all attempts used", snap.State, deref(snap.Error))
	}

	// A permanent failure is not retried, whatever attempts are left.
	perm := s.accepted(sha("y"))
	if _, err := s.result("w1", s.assigned("w1"), false, true, "bad input"); err != nil {
		t.Fatal(err)
	}
	if snap := s.status(perm); snap.State != protocol.StateFailed || !strings.Contains(deref(snap.Error), "not retried") {
		t.Fatalf("after a permanent failure: %s (%q), want FAILED, not retried", snap.State, deref(snap.Error))
	}
}

func TestSchedulingDeadlines(t *testing.T) {
	s := startMem(t, nil, func(c *Config) { c.TaskTimeout, c.MaxAttempts = 10*time.Second, 2 })
	s.register("w1", 1)
	id := s.accepted(sha("x"))
	a := s.assigned("w1")
	s.sweep(10*time.Second - time.Millisecond)
	s.quiet() // not yet at the deadline
	s.sweep(time.Millisecond)
	m := s.next()
	if c, ok := m.msg.(*protocol.TaskCancel); !ok || m.worker != "w1" || c.AttemptID != a.AttemptID {
		t.Fatalf("told %s %#v, want TASK_CANCEL of attempt %s to w1", m.worker, m.msg, a.AttemptID)
	}
	snap := s.status(id)
	if snap.State != protocol.StateRetryWait || !strings.Contains(deref(snap.Error), "execution deadline exceeded (10000 ms) on worker w1") {
		t.Fatalf("after the deadline: %s (%q), want RETRY_WAIT, deadline exceeded", snap.State, deref(snap.Error))
	}
	// The overdue attempt's result is stale; its slot went to the retry.
	if ack, err := s.result("w1", a, true, false, "late"); err != nil || ack.Accepted {
		t.Fatalf("a result after the deadline: %+v, %v; want not accepted", ack, err)
	}
	s.sweep(time.Second)
	if b := s.assigned("w1"); b.JobID != id || b.AttemptNumber != 2 {
		t.Fatalf("retry: job %s attempt %d, want %s attempt 2", b.JobID, b.AttemptNumber, id)
	}
}

func TestSchedulingCancellation(t *testing.T) {
	s := startMem(t, nil)
	queued := s.accepted(sha("queued"))
	jc, ok := s.cancel(queued).(*protocol.JobCancel)
	if !ok || !jc.Cancelled || jc.Job.State != protocol.StateCancelled {
		t.Fatalf("cancel of a queued job: %#v, want cancelled", jc)
	}
	if jc, ok := s.cancel(queued).(*protocol.JobCancel); !ok || jc.Cancelled || jc.Job.State != protocol.StateCancelled {
		t.Fatalf("cancel of a cancelled job: %#v, want cancelled:false", jc)
	}
	unknown := newID()
	if e, ok := s.cancel(unknown).(*protocol.Error); !ok || e.Message != protocol.UnknownJob(unknown).Message {
		t.Fatalf("cancel of an unknown job: %#v", e)
	}

	s.register("w1", 1)
	s.quiet() // the cancelled job never runs
	running := s.accepted(sha("running"))
	a := s.assigned("w1")
	if jc, ok := s.cancel(running).(*protocol.JobCancel); !ok || !jc.Cancelled {
		t.Fatalf("cancel of a running job: %#v", jc)
	}
	m := s.next()
	if c, ok := m.msg.(*protocol.TaskCancel); !ok || c.AttemptID != a.AttemptID {
		t.Fatalf("told %#v, want TASK_CANCEL of attempt %s", m.msg, a.AttemptID)
	}
	if ack, err := s.result("w1", a, true, false, "done anyway"); err != nil || ack.Accepted {
		t.Fatalf("result of a cancelled attempt: %+v, %v; want not accepted", ack, err)
	}
	if snap := s.status(running); snap.State != protocol.StateCancelled {
		t.Fatalf("cancelled job is %s", snap.State)
	}
	// Its slot is free again.
	next := s.accepted(sha("next"))
	if b := s.assigned("w1"); b.JobID != next {
		t.Fatalf("assigned %s, want %s in the freed slot", b.JobID, next)
	}
}

func TestSchedulingIdempotency(t *testing.T) {
	s := startMem(t, nil, func(c *Config) { c.Retention = time.Minute })
	id := s.accepted(withKey(sha("x"), "k"))
	if again := s.accepted(withKey(sha("x"), "k")); again != id {
		t.Fatalf("the same submission again: job %s, want %s", again, id)
	}
	conflict := func() {
		t.Helper()
		e, ok := s.submit(withKey(sha("other"), "k")).(*protocol.Error)
		if !ok || e.Message != protocol.IdempotencyConflict("k", id).Message {
			t.Fatalf("another submission under the key: %#v, want the conflict", e)
		}
	}
	conflict()
	s.register("w1", 1)
	s.done("w1", s.assigned("w1"))
	s.settle()
	// Finished, the key stays bound for the job's retention.
	if again := s.accepted(withKey(sha("x"), "k")); again != id {
		t.Fatalf("after the job finished: job %s, want %s", again, id)
	}
	conflict()
	s.sweep(time.Minute + time.Millisecond)
	if fresh := s.accepted(withKey(sha("other"), "k")); fresh == id {
		t.Fatal("the key is still bound after the job's retention ended")
	}
}

// TestSchedulingRecoveryAndFencing: a new coordinator over the same store recovers the
// jobs and fences the old one, which can create nothing more. An attempt running at the
// restart waits for its worker to claim it (claims.go): one claimed goes on, one
// nobody claims within the grace is lost (it counts) and its job queued again.
func TestSchedulingRecoveryAndFencing(t *testing.T) {
	b := newMemBackend()
	b.now = time.Now
	grace := func(c *Config) { c.ClaimGrace = time.Minute }
	old := startMem(t, b, grace)
	old.register("w1", 1)
	claimed := old.accepted(sha("claimed"))
	a := old.assigned("w1")
	old.register("w2", 1)
	lost := old.accepted(sha("lost"))
	old.assigned("w2")
	queued := old.accepted(sha("queued"))
	old.settle()

	next := startMem(t, b, grace)
	for _, id := range []string{claimed, lost} {
		if snap := next.status(id); snap.State != protocol.StateRunning || snap.Attempts != 1 {
			t.Fatalf("recovered running job: %s after %d attempts, want RUNNING after 1, awaiting its worker", snap.State, snap.Attempts)
		}
	}
	if snap := next.status(queued); snap.State != protocol.StateQueued {
		t.Fatalf("recovered queued job: %s", snap.State)
	}
	// w1 claims its attempt as it registers again; its result counts.
	held := &protocol.Held{Attempts: []protocol.HeldAttempt{{AttemptRef: protocol.AttemptRef{JobID: a.JobID, AttemptID: a.AttemptID}}}}
	ans, err := next.sched.reg.register(&protocol.WorkerRegister{WorkerID: "w1", Capacity: 1, Held: held})
	if err != nil || len(ans.Kept) != 1 || ans.Kept[0].AttemptID != a.AttemptID {
		t.Fatalf("w1's registration: %+v, %v; want its attempt kept", ans, err)
	}
	next.done("w1", a)
	if snap := next.status(claimed); snap.State != protocol.StateCompleted || snap.Attempts != 1 {
		t.Fatalf("claimed job: %s after %d attempts, want COMPLETED on its one attempt", snap.State, snap.Attempts)
	}
	if q := next.assigned("w1"); q.JobID != queued { // w1's slot is free again
		t.Fatalf("assigned %s to w1, want the queued job %s", q.JobID, queued)
	}
	// Nobody claims w2's: once the grace is over it is lost, and its job queued again.
	next.sweep(time.Minute)
	if snap := next.status(lost); snap.State != protocol.StateQueued || snap.Attempts != 1 {
		t.Fatalf("unclaimed job: %s after %d attempts, want QUEUED after 1", snap.State, snap.Attempts)
	}
	next.register("w3", 1)
	if again := next.assigned("w3"); again.JobID != lost || again.AttemptNumber != 2 {
		t.Fatalf("assigned %s on attempt %d, want %s on attempt 2", again.JobID, again.AttemptNumber, lost)
	}

	// The deposed coordinator creates nothing, and learns it is fenced.
	if _, ok := old.submit(sha("late")).(*protocol.Error); !ok {
		t.Fatal("a deposed coordinator stored a submission")
	}
	select {
	case <-old.c.Fenced():
	case <-time.After(10 * time.Second):
		t.Fatal("the deposed coordinator is not fenced")
	}
	if _, ok := old.submit(sha("later")).(*protocol.Error); !ok {
		t.Fatal("a fenced coordinator accepted a submission")
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func TestSchedulingLostWorker(t *testing.T) {
	s := startMem(t, nil, func(c *Config) { c.HeartbeatTimeout, c.MaxAttempts = 10*time.Second, 2 })
	s.register("w1", 1)
	id := s.accepted(sha("x"))
	s.assigned("w1")
	s.sweep(10 * time.Second)
	if snap := s.status(id); snap.State != protocol.StateRunning {
		t.Fatalf("a worker silent for the heartbeat timeout, not longer, lost its job: %s", snap.State)
	}
	s.sweep(time.Millisecond)
	snap := s.status(id)
	if snap.State != protocol.StateRetryWait || snap.Attempts != 1 || deref(snap.Error) != "worker w1 lost (heartbeat timeout)" {
		t.Fatalf("after the heartbeat timeout: %s after %d attempts (%q), want RETRY_WAIT after 1, worker lost",
			snap.State, snap.Attempts, deref(snap.Error))
	}
	if _, err := s.sched.reg.heartbeat(&protocol.Heartbeat{WorkerID: "w1"}); !errors.Is(err, bus.CodeNotFound) {
		t.Fatalf("heartbeat of a lost worker: %v, want not found (register again)", err)
	}
}

func TestSchedulingDrain(t *testing.T) {
	s := startMem(t, nil)
	s.register("w1", 2)
	running := s.accepted(sha("running"))
	a := s.assigned("w1")
	ack, err := s.sched.reg.drain(&protocol.Drain{WorkerID: "w1"})
	if err != nil || ack.Running != 1 {
		t.Fatalf("drain: %+v, %v; want 1 running", ack, err)
	}
	queued := s.accepted(sha("queued"))
	s.quiet() // a draining worker takes nothing more, though it has a free slot
	s.done("w1", a)
	if snap := s.status(running); snap.State != protocol.StateCompleted {
		t.Fatalf("the draining worker's attempt: %s, want COMPLETED", snap.State)
	}
	s.register("w2", 1)
	if b := s.assigned("w2"); b.JobID != queued {
		t.Fatalf("assigned %s to w2, want %s", b.JobID, queued)
	}
}

// TestSchedulingUndeliveredAssignment: an assignment the worker's report shows it never
// received (numbered up to the mark it heard, and not held) is queued again at once,
// without counting the attempt; an attempt it holds under no lease is cancelled again.
func TestSchedulingUndeliveredAssignment(t *testing.T) {
	s := startMem(t, nil)
	reg, err := s.sched.reg.register(&protocol.WorkerRegister{WorkerID: "w1", Capacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := s.accepted(sha("x"))
	lost := s.assigned("w1")
	mark, err := s.sched.reg.heartbeat(&protocol.Heartbeat{WorkerID: "w1"})
	if err != nil || mark.Mark == nil || mark.Mark.Session != reg.Mark.Session || mark.Mark.Seq != 1 {
		t.Fatalf("heartbeat: %+v, %v; want the registration's mark at 1", mark, err)
	}
	stray := protocol.HeldAttempt{AttemptRef: protocol.AttemptRef{JobID: newID(), AttemptID: newID()}}
	held := &protocol.Held{Mark: *mark.Mark, Attempts: []protocol.HeldAttempt{stray}}
	if _, err := s.sched.reg.heartbeat(&protocol.Heartbeat{WorkerID: "w1", Held: held}); err != nil {
		t.Fatal(err)
	}
	var again *protocol.TaskAssign
	var cancelled *protocol.TaskCancel
	for again == nil || cancelled == nil {
		switch m := s.next().msg.(type) {
		case *protocol.TaskAssign:
			again = m
		case *protocol.TaskCancel:
			cancelled = m
		}
	}
	if again.JobID != id || again.AttemptNumber != 1 || again.AttemptID == lost.AttemptID {
		t.Fatalf("assigned again %+v, want job %s on a new attempt numbered 1", again, id)
	}
	if cancelled.AttemptID != stray.AttemptID {
		t.Fatalf("cancelled %+v, want the stray attempt %s", cancelled, stray.AttemptID)
	}
}
