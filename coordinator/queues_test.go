package coordinator

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Named queues, weights and strict order, pause, max running, concurrency keys and
// their rotation: dispatch's rules (dispatch.go, queue.go, queueapi.go), on the
// in-memory coordinator of scheduling_test.go.

func inQueue(req *protocol.SubmitJob, queue string) *protocol.SubmitJob {
	req.Queue = queue
	return req
}

func withConcurrencyKey(req *protocol.SubmitJob, key string) *protocol.SubmitJob {
	req.ConcurrencyKey = key
	return req
}

// registerQueues registers a worker serving qs ("critical=6,default=3").
func (s *memSystem) registerQueues(id string, capacity int, qs string, strict bool) {
	s.t.Helper()
	ws, err := protocol.ParseQueueWeights(qs)
	if err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.sched.reg.register(&protocol.WorkerRegister{WorkerID: id, Capacity: capacity, Queues: ws, StrictQueues: strict}); err != nil {
		s.t.Fatal(err)
	}
}

// queueOfJob is the queue of the job with id, as stored.
func (s *memSystem) queueOfJob(id string) string {
	s.t.Helper()
	s.sched.mu.Lock()
	defer s.sched.mu.Unlock()
	return protocol.QueueOf(s.sched.jobs[id].rec.Queue)
}

// change applies a queue API request and returns its answer.
func (s *memSystem) change(m protocol.Message) protocol.Message {
	s.t.Helper()
	got := make(chan protocol.Message, 1)
	s.c.api.serveQueues(m, request{due: time.Second}, func(m protocol.Message) { got <- m })
	return <-got
}

func (s *memSystem) updated(m protocol.Message) protocol.QueueInfo {
	s.t.Helper()
	u, ok := s.change(m).(*protocol.QueueUpdated)
	if !ok {
		s.t.Fatalf("%T %+v answered %#v, want QUEUE_UPDATED", m, m, u)
	}
	return u.Queue
}

func (s *memSystem) queueInfo(name string) protocol.QueueInfo {
	s.t.Helper()
	for _, q := range s.sched.queueList() {
		if q.Name == name {
			return q
		}
	}
	s.t.Fatalf("queue %s not listed", name)
	return protocol.QueueInfo{}
}

// waitQueued waits until the queue named name has n jobs waiting: a job is made ready
// just after its submission is answered.
func (s *memSystem) waitQueued(name string, n int) {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.sched.mu.Lock()
		q := s.sched.ready.queues[name]
		got := 0
		if q != nil {
			got = q.size
		}
		s.sched.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("queue %s holds %d jobs, want %d", name, got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// unfinishedAgree checks each queue's count of unfinished jobs against the jobs: those
// held whole and not finished, and the far SCHEDULED ones held by their entry.
func (s *memSystem) unfinishedAgree() {
	s.t.Helper()
	s.sched.mu.Lock()
	defer s.sched.mu.Unlock()
	want := make(map[string]int)
	for _, j := range s.sched.jobs {
		if j.rec.State.Active() {
			want[queueOf(j)]++
		}
	}
	x := &s.sched.kept.index
	for i := range x.entries {
		if e := &x.entries[i]; e.live() && e.j == nil && e.state() == protocol.StateScheduled {
			want[x.queue(e)]++
		}
	}
	for name, q := range s.sched.ready.queues {
		if q.unfinished != want[name] {
			s.t.Errorf("queue %s counts %d unfinished jobs, holds %d", name, q.unfinished, want[name])
		}
		delete(want, name)
	}
	for name, n := range want {
		s.t.Errorf("queue %s holds %d unfinished jobs, and is not known", name, n)
	}
}

func TestQueuesWeightsShareStarts(t *testing.T) {
	const starts = 10_000
	s := startMem(t, nil, func(c *Config) { c.MaxActiveJobs = 20_000 })
	want := map[string]float64{"critical": 0.6, "default": 0.3, "low": 0.1}
	for q, share := range want { // every queue stays full to the end
		for i := range int(share*starts) + 50 {
			s.accepted(inQueue(sha(fmt.Sprint(q, i)), q))
		}
		s.waitQueued(q, int(share*starts)+50)
	}
	s.registerQueues("w1", 1, "critical=6,default=3,low=1", false)
	got := map[string]int{}
	for range starts {
		a := s.assigned("w1")
		got[s.queueOfJob(a.JobID)]++
		s.done("w1", a)
	}
	for q, share := range want {
		if d := math.Abs(float64(got[q])/starts - share); d > 0.02 {
			t.Errorf("queue %s: %d of %d starts, want %.0f%% within 2 points", q, got[q], starts, share*100)
		}
	}
	t.Logf("starts by queue over %d: %v", starts, got)
}

func TestQueuesWeightsSkipEmptyQueues(t *testing.T) {
	s := startMem(t, nil)
	for i := range 5 {
		s.accepted(inQueue(sha(fmt.Sprint("low", i)), "low"))
	}
	s.waitQueued("low", 5)
	s.registerQueues("w1", 1, "critical=6,low=1", false)
	for range 5 { // critical is empty: low takes every start, not one in seven
		a := s.assigned("w1")
		if q := s.queueOfJob(a.JobID); q != "low" {
			t.Fatalf("started a job of %s", q)
		}
		s.done("w1", a)
	}
}

func TestQueuesStrictOrder(t *testing.T) {
	s := startMem(t, nil)
	var low []string
	for i := range 2 {
		low = append(low, s.accepted(inQueue(sha(fmt.Sprint("low", i)), "low")))
	}
	critical := s.accepted(inQueue(sha("critical"), "critical"))
	other := s.accepted(inQueue(sha("elsewhere"), "elsewhere")) // not served
	s.waitQueued("critical", 1)
	s.waitQueued("low", 2)
	s.registerQueues("w1", 1, "critical,low", true)
	var order []string
	for range 3 {
		a := s.assigned("w1")
		order = append(order, a.JobID)
		s.done("w1", a)
	}
	if want := []string{critical, low[0], low[1]}; strings.Join(order, " ") != strings.Join(want, " ") {
		t.Fatalf("order %v, want critical first, then low: %v", order, want)
	}
	s.quiet()
	if st := s.status(other).State; st != protocol.StateQueued {
		t.Fatalf("a job of a queue no worker serves: %s, want QUEUED", st)
	}
}

func TestQueuesDefaultQueue(t *testing.T) {
	s := startMem(t, nil)
	named := s.accepted(inQueue(sha("x"), "default"))
	plain := s.accepted(sha("y"))
	s.accepted(inQueue(sha("z"), "other"))
	s.register("w1", 4) // names no queues: serves default only
	got := map[string]bool{s.assigned("w1").JobID: true, s.assigned("w1").JobID: true}
	if !got[named] || !got[plain] {
		t.Fatalf("assigned %v, want %s and %s", got, named, plain)
	}
	s.quiet()
	s.sched.mu.Lock()
	stored := s.sched.jobs[named].rec.Queue
	s.sched.mu.Unlock()
	if stored != "" {
		t.Fatalf("a job sent to the default queue by name is stored with queue %q, want \"\"", stored)
	}
}

func TestQueuesPauseAndResume(t *testing.T) {
	b := newMemBackend()
	b.now = time.Now
	s := startMem(t, b)
	if e, ok := s.change(&protocol.PauseQueue{Queue: "nosuch"}).(*protocol.Error); !ok || !protocol.IsUnknownQueue(e.Message) {
		t.Fatalf("pause of an unknown queue: %#v, want Unknown queue", e)
	}
	if e, ok := s.change(&protocol.PauseQueue{Queue: "bad.name"}).(*protocol.Error); !ok || !strings.HasPrefix(e.Message, "Invalid queue: ") {
		t.Fatalf("pause of a bad name: %#v, want Invalid queue", e)
	}
	first := s.accepted(inQueue(sha("a"), "low"))
	if q := s.updated(&protocol.PauseQueue{Queue: "low"}); !q.Paused {
		t.Fatalf("paused queue: %+v", q)
	}
	second := s.accepted(inQueue(sha("b"), "low")) // a paused queue accepts jobs
	s.waitQueued("low", 2)
	s.registerQueues("w1", 2, "low", false)
	s.quiet() // and starts none
	if q := s.queueInfo("low"); !q.Paused || q.Queued != 2 || q.Workers != 1 {
		t.Fatalf("paused queue: %+v, want 2 queued", q)
	}

	// A new coordinator on the same store (a restart, a failover) keeps the pause.
	s.c.Close()
	next := startMem(t, b)
	next.registerQueues("w1", 2, "low", false)
	next.quiet()
	if q := next.queueInfo("low"); !q.Paused || q.Queued != 2 {
		t.Fatalf("after a restart: %+v, want paused with 2 queued", q)
	}
	if q := next.updated(&protocol.ResumeQueue{Queue: "low"}); q.Paused {
		t.Fatalf("resumed queue: %+v", q)
	}
	got := map[string]bool{next.assigned("w1").JobID: true, next.assigned("w1").JobID: true}
	if !got[first] || !got[second] {
		t.Fatalf("assigned %v after resume, want %s and %s", got, first, second)
	}
	// Resumed, the queue holds defaults again: its control is gone.
	if cs, _ := next.sched.store.controls().list(t.Context(), protocol.QueueControlPrefix); len(cs) != 0 {
		t.Fatalf("controls after resume: %v", cs)
	}
}

func TestQueuesMaxRunning(t *testing.T) {
	s := startMem(t, nil)
	if e, ok := s.change(&protocol.SetQueue{Queue: "batch", MaxRunning: intp(-1)}).(*protocol.Error); !ok || !strings.Contains(e.Message, "maxRunning must be in") {
		t.Fatalf("a negative max running: %#v", e)
	}
	if q := s.updated(&protocol.SetQueue{Queue: "batch", MaxRunning: intp(2)}); q.MaxRunning != 2 {
		t.Fatalf("set: %+v", q) // set creates the queue
	}
	for i := range 4 {
		s.accepted(inQueue(sha(fmt.Sprint(i)), "batch"))
	}
	s.waitQueued("batch", 4)
	s.registerQueues("w1", 4, "batch", false)
	a, b := s.assigned("w1"), s.assigned("w1")
	s.quiet()
	if q := s.queueInfo("batch"); q.Running != 2 || q.Queued != 2 || q.Throttled == 0 {
		t.Fatalf("at max running: %+v", q)
	}
	s.done("w1", a)
	s.assigned("w1")
	s.quiet()
	s.updated(&protocol.SetQueue{Queue: "batch", MaxRunning: intp(0)}) // unbounded
	s.assigned("w1")
	s.done("w1", b)
}

func TestQueuesKeysTakeTurns(t *testing.T) {
	s := startMem(t, nil)
	for i := range 1000 {
		s.accepted(withConcurrencyKey(sha(fmt.Sprint("a", i)), "customer-a"))
	}
	b := s.accepted(withConcurrencyKey(sha("b"), "customer-b"))
	plain := s.accepted(sha("no key"))
	s.waitQueued("default", 1002)
	s.register("w1", 1)
	var order []string
	for range 3 {
		a := s.assigned("w1")
		order = append(order, a.JobID)
		s.done("w1", a)
	}
	// One of A's jobs, then B's and the keyless one's turns, before A's second.
	if order[1] != b || order[2] != plain {
		t.Fatalf("starts %v: want B's job (%s) and the unkeyed one (%s) within the first three", order, b, plain)
	}
	if q := s.queueInfo("default"); q.Keys != 1 || q.Queued != 998 {
		t.Fatalf("queue: %+v, want 998 queued under 1 key", q)
	}
}

func TestQueuesKeyConcurrency(t *testing.T) {
	s := startMem(t, nil)
	s.updated(&protocol.SetQueue{Queue: "default", KeyConcurrency: intp(1)})
	var a []string
	for i := range 3 {
		a = append(a, s.accepted(withConcurrencyKey(sha(fmt.Sprint("a", i)), "A")))
	}
	b := s.accepted(withConcurrencyKey(sha("b"), "B"))
	s.waitQueued("default", 4)
	s.register("w1", 4)
	got := map[string]*protocol.TaskAssign{}
	for range 2 {
		as := s.assigned("w1")
		got[as.JobID] = as
	}
	if got[a[0]] == nil || got[b] == nil {
		t.Fatalf("started %v, want A's first and B's", got)
	}
	s.quiet() // A is at its limit: its others wait, though slots are free
	s.done("w1", got[a[0]])
	if next := s.assigned("w1"); next.JobID != a[1] {
		t.Fatalf("after A's first ended: %s, want A's second", next.JobID)
	}
	s.quiet()
	// Raising the limit lets the rest start at once.
	s.updated(&protocol.SetQueue{Queue: "default", KeyConcurrency: intp(2)})
	if next := s.assigned("w1"); next.JobID != a[2] {
		t.Fatalf("after the limit rose: %s, want A's third", next.JobID)
	}
}

// keyFrom declares that taskType takes its concurrency key from its payload at
// pointer, at most n running per key.
func (s *memSystem) keyFrom(taskType, pointer string, n int) {
	s.sched.cat.mu.Lock()
	defer s.sched.cat.mu.Unlock()
	s.sched.cat.types[taskType] = &catalogued{rec: protocol.TaskTypeRecord{Name: taskType,
		Options: protocol.TaskTypeOptions{ConcurrencyKey: pointer, KeyConcurrency: n}}}
}

func TestQueuesKeyFromPayload(t *testing.T) {
	s := startMem(t, nil)
	s.keyFrom("SEND_EMAIL", "/customer/id", 1)
	email := func(payload string) *protocol.SubmitJob {
		return &protocol.SubmitJob{TaskType: "SEND_EMAIL", Payload: json.RawMessage(payload)}
	}
	id := s.accepted(email(`{"customer":{"id":42}}`))
	s.sched.mu.Lock()
	key := s.sched.jobs[id].rec.ConcurrencyKey
	s.sched.mu.Unlock()
	if key != "42" {
		t.Fatalf("key %q, want 42 from /customer/id", key)
	}
	// A key given with the submission wins over the pointer.
	id = s.accepted(withConcurrencyKey(email(`{"customer":{"id":42}}`), "vip"))
	s.sched.mu.Lock()
	key = s.sched.jobs[id].rec.ConcurrencyKey
	s.sched.mu.Unlock()
	if key != "vip" {
		t.Fatalf("key %q, want the submission's vip", key)
	}
	for _, payload := range []string{`{"customer":{}}`, `{"customer":{"id":null}}`, `{"other":1}`} {
		e, ok := s.submit(email(payload)).(*protocol.Error)
		if !ok || !strings.HasPrefix(e.Message, "Invalid payload: task type SEND_EMAIL takes its concurrency key from the payload at /customer/id") {
			t.Errorf("payload %s: %#v, want Invalid payload naming the pointer", payload, e)
		}
	}
}

// TestQueuesKeyFromPayloadInGroups: the steps of a batch or workflow take their key
// from the payload as a submission does, so that the type's per-key limit holds them
// too; a step whose payload does not resolve the pointer is refused with the group.
func TestQueuesKeyFromPayloadInGroups(t *testing.T) {
	s := startMem(t, nil)
	s.keyFrom("SHA256", "/customer", 1)
	group := func(req *protocol.SubmitWorkflow) protocol.Message {
		got := make(chan protocol.Message, 1)
		s.sched.submitGroup(req, request{due: time.Minute}, func(m protocol.Message) { got <- answerOf(m) })
		select {
		case m := <-got:
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no answer to a group submission")
			return nil
		}
	}
	step := func(name, customer string) protocol.WorkflowStep {
		return protocol.WorkflowStep{Name: name, TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x","customer":"` + customer + `"}`)}
	}
	if e, ok := group(&protocol.SubmitWorkflow{WorkflowID: "bad", Kind: protocol.KindBatch,
		Steps: []protocol.WorkflowStep{step("a", "a"), {Name: "x", TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`)}}}).(*protocol.Error); !ok ||
		!strings.Contains(e.Message, "step x: Invalid payload: task type SHA256 takes its concurrency key from the payload at /customer") {
		t.Fatalf("a step whose payload has no key: %#v, want an error naming it", e)
	}
	m := group(&protocol.SubmitWorkflow{WorkflowID: "emails", Kind: protocol.KindBatch,
		Steps: []protocol.WorkflowStep{step("a1", "a"), step("a2", "a"), step("a3", "a"), step("b1", "b")}})
	sub, ok := m.(*protocol.WorkflowSubmitted)
	if !ok {
		t.Fatalf("batch answered %#v", m)
	}
	s.sched.mu.Lock()
	for name, id := range sub.Jobs {
		if j := s.sched.jobs[id]; j == nil || j.rec.ConcurrencyKey != name[:1] {
			t.Errorf("step %s: key %q, want %q from /customer", name, j.rec.ConcurrencyKey, name[:1])
		}
	}
	s.sched.mu.Unlock()
	s.waitQueued("default", 4)
	s.register("w1", 4)
	started := map[string]bool{}
	for range 2 {
		started[s.assigned("w1").JobID] = true
	}
	if !started[sub.Jobs["b1"]] {
		t.Fatalf("started %v, want one of key a and b1", started)
	}
	s.quiet() // key a is at its limit of 1: its other steps wait, though slots are free
	s.unfinishedAgree()
}

func TestQueuesRefuseBadInput(t *testing.T) {
	s := startMem(t, nil)
	for _, tc := range []struct {
		req  *protocol.SubmitJob
		want string
	}{
		{inQueue(sha("x"), "a.b"), `Invalid queue: bad queue name "a.b"`},
		{inQueue(sha("x"), strings.Repeat("q", 65)), "Invalid queue: "},
		{withConcurrencyKey(sha("x"), strings.Repeat("k", 257)), "Invalid concurrency key: concurrency key must be 1 to 256 bytes, got 257"},
	} {
		if e, ok := s.submit(tc.req).(*protocol.Error); !ok || !strings.HasPrefix(e.Message, tc.want) {
			t.Errorf("%+v answered %#v, want %q", tc.req, e, tc.want)
		}
	}
	for _, qs := range [][]protocol.QueueWeight{{{Name: "a", Weight: 0}}, {{Name: "a", Weight: 1}, {Name: "a", Weight: 2}}, {{Name: "x y", Weight: 1}}} {
		_, err := s.sched.reg.register(&protocol.WorkerRegister{WorkerID: "w", Capacity: 1, Queues: qs})
		if err == nil || !strings.Contains(err.Error(), "Registration refused: bad queue") {
			t.Errorf("registration with queues %v: %v, want a refusal", qs, err)
		}
	}
}

func TestQueuesListed(t *testing.T) {
	s := startMem(t, nil)
	s.accepted(inQueue(sha("a"), "reports"))
	s.waitQueued("reports", 1)
	s.clock.advance(3 * time.Second)
	s.registerQueues("w1", 1, "emails", false)
	qs := s.sched.queueList()
	var names []string
	for _, q := range qs {
		names = append(names, q.Name)
	}
	if strings.Join(names, ",") != "emails,reports" {
		t.Fatalf("queues %v, want emails (served) and reports (used)", names)
	}
	if r := qs[1]; r.Queued != 1 || r.LatencyMillis != 3000 || r.Workers != 0 {
		t.Fatalf("reports: %+v, want 1 queued for 3 s, no worker", r)
	}
	if e := qs[0]; e.Workers != 1 {
		t.Fatalf("emails: %+v, want 1 worker", e)
	}
}

func TestSeqHeapOrder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	var h seqHeap
	for i := range 2000 {
		h.push(queued{at: int64(rng.IntN(50)), seq: uint64(i)})
		if rng.IntN(3) == 0 {
			h.pop()
		}
	}
	var last queued
	for i := 0; len(h) > 0; i++ {
		e := h[0]
		if i > 0 && (e.at < last.at || e.at == last.at && e.seq < last.seq) {
			t.Fatalf("popped (%d, %d) after (%d, %d)", e.at, e.seq, last.at, last.seq)
		}
		last = e
		h.pop()
	}
}

// BenchmarkDispatch measures one start through dispatch (schedule with one free slot)
// with n jobs waiting: one queue, or three by weight. allocs/op is dispatch's own,
// besides the assignment's record write it queues.
//
//	go test -run '^$' -bench Dispatch -benchmem ./coordinator/
func BenchmarkDispatch(b *testing.B) {
	for _, tc := range []struct {
		name   string
		queues string
		keys   int
	}{{"OneQueue", "default", 0}, {"ThreeQueuesWeighted", "critical=6,default=3,low=1", 0}, {"OneQueue1000Keys", "default", 1000}} {
		b.Run(tc.name, func(b *testing.B) {
			s := &scheduler{cfg: &Config{AgingStep: time.Minute}, cat: newCatalogue(nil, nil), ready: newReadyQueue()}
			s.route = &routing{s: s, cfg: s.cfg, cat: s.cat, typeRuns: map[string]int{}}
			ws, _ := protocol.ParseQueueWeights(tc.queues)
			w := &worker{id: "w", capacity: 1, taskTypes: map[string]bool{"SHA256": true},
				queues: servedQueues(&protocol.WorkerRegister{Queues: ws}), running: map[string]assignment{}}
			now := time.Now()
			seq := uint64(0)
			add := func() {
				seq++
				j := queuedJob(seq, protocol.PriorityNormal, now.UnixMilli(), "SHA256")
				j.rec.Queue = ws[int(seq)%len(ws)].Name
				if tc.keys > 0 {
					j.rec.ConcurrencyKey = fmt.Sprint("k", int(seq)%tc.keys)
				}
				s.ready.push(j)
			}
			for range 10_000 {
				add()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				j := s.jobFor(w, now)
				s.ready.pop(j)
				seq++ // the job started; it comes back as a new one, at the end of its level
				j.rec.Seq = seq
				s.ready.push(j)
			}
		})
	}
}

func intp(n int) *int { return &n }

func TestQueuesIdleOnesForgotten(t *testing.T) {
	s := startMem(t, nil)
	s.registerQueues("w1", 1, "tmp", false)
	s.done("w1", func() *protocol.TaskAssign {
		s.accepted(withConcurrencyKey(inQueue(sha("x"), "tmp"), "k"))
		return s.assigned("w1")
	}())
	s.accepted(inQueue(sha("y"), "unserved"))
	gone := s.accepted(inQueue(sha("z"), "gone"))
	s.waitQueued("gone", 1)
	if m, ok := s.cancel(gone).(*protocol.JobCancel); !ok || !m.Cancelled {
		t.Fatalf("cancel: %#v", m)
	}
	s.sweep(collectEvery) // marks them idle
	s.sweep(collectEvery) // forgets what stayed idle
	var names []string
	for _, q := range s.sched.queueList() {
		names = append(names, q.Name)
	}
	// tmp is served; unserved holds a job; gone held nothing for a whole period.
	if strings.Join(names, ",") != "tmp,unserved" {
		t.Fatalf("queues %v, want tmp and unserved", names)
	}
	s.sched.mu.Lock()
	keys := len(s.sched.ready.queues["tmp"].byType["SHA256"].keys)
	s.sched.mu.Unlock()
	if keys != 0 {
		t.Fatalf("tmp still knows %d keys, want its empty key forgotten", keys)
	}
}

// TestQueuesRandomisedLimitsHold drives dispatch with random queues, keys, cancels,
// pauses and completions on three workers, and checks at every assignment that no
// key runs more than its limit and no queue more than its max running, and at the
// end that every job not cancelled completed: no job is lost in a lane.
func TestQueuesRandomisedLimitsHold(t *testing.T) {
	for seed := range uint64(12) {
		t.Run(fmt.Sprint("Seed", seed), func(t *testing.T) { randomisedDispatch(t, seed) })
	}
}

func randomisedDispatch(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 8))
	s := startMem(t, nil, func(c *Config) { c.TaskTimeout = 24 * time.Hour })
	sweeps := 0
	queues := []string{"a", "b", "c"}
	s.updated(&protocol.SetQueue{Queue: "a", KeyConcurrency: intp(1)})
	s.updated(&protocol.SetQueue{Queue: "b", MaxRunning: intp(3), KeyConcurrency: intp(2)})
	s.updated(&protocol.SetQueue{Queue: "c"})
	limits := map[string][2]int{"a": {0, 1}, "b": {3, 2}, "c": {0, 0}} // max running, per key
	type job struct{ queue, key string }
	jobs := map[string]job{}
	submit := func() {
		q := queues[rng.IntN(3)]
		key := ""
		if rng.IntN(4) > 0 {
			key = fmt.Sprint("k", rng.IntN(5))
		}
		req := inQueue(sha(fmt.Sprint(len(jobs), q, key)), q)
		if key != "" {
			req = withConcurrencyKey(req, key)
		}
		jobs[s.accepted(req)] = job{q, key}
	}
	for range 60 {
		submit()
	}
	for i, w := range []string{"w1", "w2", "w3"} {
		s.registerQueues(w, 2+i, []string{"a=3,b=2,c=1", "c,b,a", "b=1,a=1"}[i], i == 1)
	}
	running := map[string]*protocol.TaskAssign{}
	runKey := map[[2]string]int{}
	runQueue := map[string]int{}
	cancelled := map[string]bool{}
	finish := func(id string, w string) {
		a := running[id]
		delete(running, id)
		j := jobs[id]
		runQueue[j.queue]--
		if j.key != "" {
			runKey[[2]string{j.queue, j.key}]--
		}
		s.done(w, a)
	}
	owner := map[string]string{}
	paused := false
	for step := 0; ; step++ {
		select {
		case m := <-s.told:
			a, ok := m.msg.(*protocol.TaskAssign)
			if !ok {
				continue
			}
			j := jobs[a.JobID]
			running[a.JobID], owner[a.JobID] = a, m.worker
			runQueue[j.queue]++
			if l := limits[j.queue][0]; l > 0 && runQueue[j.queue] > l {
				t.Fatalf("queue %s runs %d, over its max %d", j.queue, runQueue[j.queue], l)
			}
			if j.key != "" {
				k := [2]string{j.queue, j.key}
				runKey[k]++
				if l := limits[j.queue][1]; l > 0 && runKey[k] > l {
					t.Fatalf("key %v runs %d, over its limit %d", k, runKey[k], l)
				}
			}
			continue
		default:
		}
		s.settle()
		if len(s.told) > 0 {
			continue
		}
		switch r := rng.IntN(10); {
		case r < 6 && len(running) > 0:
			for id := range running { // any one
				finish(id, owner[id])
				break
			}
		case r == 6 && step < 400:
			submit()
		case r == 7 && step < 400:
			for id := range jobs {
				if running[id] == nil && !cancelled[id] && rng.IntN(20) == 0 {
					if c, ok := s.cancel(id).(*protocol.JobCancel); ok && c.Cancelled {
						cancelled[id] = true
					}
				}
			}
		case r == 9 && sweeps < 20: // idle keys and queues forgotten meanwhile
			sweeps++
			s.sweep(collectEvery)
		case r == 8:
			if paused {
				s.updated(&protocol.ResumeQueue{Queue: "c"})
			} else if step < 400 {
				s.updated(&protocol.PauseQueue{Queue: "c"})
			}
			paused = !paused && step < 400
		}
		if step > 400 && len(running) == 0 && !paused {
			s.settle()
			s.sched.mu.Lock()
			left := 0
			for _, j := range s.sched.jobs {
				if j.rec.State == protocol.StateQueued || j.rec.State == protocol.StateRunning {
					left++
				}
			}
			s.sched.mu.Unlock()
			if left == 0 {
				break
			}
			s.told <- s.next() // an assignment on its way (sent once its write landed)
		}
		if step > 20_000 {
			t.Fatal("no end in sight")
		}
	}
	for id, j := range jobs {
		st := s.status(id).State
		if want := protocol.StateCompleted; cancelled[id] {
			want = protocol.StateCancelled
			if st != want {
				t.Errorf("job %s (%+v): %s, want %s", id, j, st, want)
			}
		} else if st != want {
			t.Errorf("job %s (%+v): %s, want %s", id, j, st, want)
		}
	}
	s.unfinishedAgree()
	t.Logf("%d jobs, %d cancelled", len(jobs), len(cancelled))
}

// TestQueuesOfWaitingJobsStayKnown: a queue whose jobs are all SCHEDULED, WAITING or
// in RETRY_WAIT stays known however many collects pass, and across a restart: it can be
// paused before its jobs come due, and a job that comes due in it then waits until it
// is resumed. Once its jobs finished it is forgotten as any idle queue, and a name
// nothing ever used is still refused.
func TestQueuesOfWaitingJobsStayKnown(t *testing.T) {
	b := newMemBackend()
	b.now = time.Now
	slowRetry := func(c *Config) { c.RetryBaseDelay, c.RetryMaxDelay = time.Hour, time.Hour }
	s := startMem(t, b, slowRetry)
	later := s.accepted(inQueue(runIn(sha("x"), time.Hour), "later"))
	parent := s.accepted(sha("parent")) // QUEUED in default, which no worker serves
	child := inQueue(sha("child"), "waiting")
	child.After = []string{parent}
	s.accepted(child)
	s.registerQueues("w", 1, "retrying", false)
	s.accepted(inQueue(sha("y"), "retrying"))
	s.assigned("w")
	s.sched.reg.disconnect(&protocol.Disconnect{WorkerID: "w", Cause: "gone"}) // RETRY_WAIT for an hour
	s.settle()
	held := map[string]protocol.State{"later": protocol.StateScheduled, "waiting": protocol.StateWaiting, "retrying": protocol.StateRetryWait}
	for name, st := range held {
		if n := s.c.Stats().Jobs[st]; n != 1 {
			t.Fatalf("%d jobs %s, want the one of queue %s", n, st, name)
		}
	}
	pausable := func(s *memSystem, when string) {
		t.Helper()
		for name, st := range held {
			if e, ok := s.change(&protocol.PauseQueue{Queue: name}).(*protocol.Error); ok {
				t.Errorf("pause of queue %s holding a %s job, %s: %s", name, st, when, e.Message)
				continue
			}
			s.updated(&protocol.ResumeQueue{Queue: name})
		}
		if e, ok := s.change(&protocol.PauseQueue{Queue: "latr"}).(*protocol.Error); !ok || !protocol.IsUnknownQueue(e.Message) {
			t.Errorf("pause of a queue nothing used, %s: %#v, want Unknown queue", when, e)
		}
	}
	s.sweep(collectEvery)
	s.sweep(collectEvery)
	s.unfinishedAgree()
	pausable(s, "after two collects")
	s.c.Close()

	next := startMem(t, b, slowRetry)
	pausable(next, "after a restart")
	next.sweep(collectEvery)
	next.sweep(collectEvery)
	next.unfinishedAgree()
	pausable(next, "after a restart and two collects")

	// Paused before its job comes due, the queue starts it only once resumed.
	next.updated(&protocol.PauseQueue{Queue: "later"})
	next.sweep(time.Hour)
	eventuallyTrue(t, "the job of queue later read back", func() bool { return next.held(later) })
	next.sweep(time.Millisecond)                 // its timer, armed as it was read back
	next.registerQueues("w2", 1, "later", false) // registered after the hour, not lost in it
	next.quiet()
	if st := next.status(later).State; st != protocol.StateQueued {
		t.Fatalf("the job of paused queue later, due: %s, want QUEUED", st)
	}
	next.updated(&protocol.ResumeQueue{Queue: "later"})
	a := next.assigned("w2")
	if a.JobID != later {
		t.Fatalf("assigned %s, want the job of queue later", a.JobID)
	}
	next.done("w2", a)
	next.sched.reg.disconnect(&protocol.Disconnect{WorkerID: "w2", Cause: "gone"})
	next.sweep(collectEvery)
	next.sweep(collectEvery)
	if e, ok := next.change(&protocol.PauseQueue{Queue: "later"}).(*protocol.Error); !ok || !protocol.IsUnknownQueue(e.Message) {
		t.Errorf("pause of a queue whose one job finished two collects ago: %#v, want Unknown queue", e)
	}
	next.unfinishedAgree()
}
