package attempts_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker/internal/attempts"
	"github.com/jobbus/jobbus/worker/tasks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Task types of the test registry.
const (
	typeBlock  = "BLOCK"  // runs until its context ends
	typeEcho   = "ECHO"   // returns its payload
	typePanic  = "PANIC"  // panics
	typeIgnore = "IGNORE" // waits for its context to end, then succeeds anyway
	typeGoexit = "GOEXIT" // ends its goroutine without returning (runtime.Goexit)
)

// task is a tasks.Task from a function.
type task func(ctx context.Context, payload json.RawMessage) (string, error)

func (task) Validate(json.RawMessage) error { return nil }
func (f task) Run(ctx context.Context, _ int, p json.RawMessage) (string, error) {
	return f(ctx, p)
}

func registry(t *testing.T) *tasks.Registry {
	t.Helper()
	r := tasks.NewRegistry()
	for name, f := range map[string]task{
		typeBlock: func(ctx context.Context, _ json.RawMessage) (string, error) {
			<-ctx.Done()
			return "", ctx.Err()
		},
		typeEcho: func(_ context.Context, p json.RawMessage) (string, error) { return string(p), nil },
		typePanic: func(context.Context, json.RawMessage) (string, error) {
			panic("kaboom")
		},
		typeIgnore: func(ctx context.Context, _ json.RawMessage) (string, error) {
			<-ctx.Done()
			return "done anyway", nil
		},
		typeGoexit: func(context.Context, json.RawMessage) (string, error) {
			runtime.Goexit() // as testing's FailNow does, or a library that gives up so
			return "", nil
		},
	} {
		if err := r.Register(name, f); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// logs is a concurrency-safe log buffer.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.buf.String(), s)
}

// fixture is a Set and the outcomes it delivered, by lease.
type fixture struct {
	set  *attempts.Set
	logs *logs

	mu       sync.Mutex
	outcomes map[attempts.Lease][]attempts.Outcome
}

func setup(t *testing.T, capacity int) *fixture {
	t.Helper()
	l := &logs{}
	log := slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f := &fixture{set: attempts.New(registry(t), capacity, log), logs: l, outcomes: make(map[attempts.Lease][]attempts.Outcome)}
	t.Cleanup(func() {
		f.set.Shutdown(errors.New("test over"))
		f.set.Wait()
	})
	return f
}

func assign(job, attemptID, taskType, payload string) *protocol.TaskAssign {
	return &protocol.TaskAssign{JobID: job, AttemptID: attemptID, TaskType: taskType, AttemptNumber: 1,
		Payload: json.RawMessage(payload)}
}

// start starts an attempt under parent, recording its outcome.
func (f *fixture) start(parent context.Context, m *protocol.TaskAssign) bool {
	l := attempts.Lease{JobID: m.JobID, AttemptID: m.AttemptID}
	return f.set.Start(parent, m, finishFunc(func(o attempts.Outcome) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.outcomes[l] = append(f.outcomes[l], o)
	}))
}

func (f *fixture) outcomesOf(job, attemptID string) []attempts.Outcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]attempts.Outcome(nil), f.outcomes[attempts.Lease{JobID: job, AttemptID: attemptID}]...)
}

// outcome waits for the one outcome of a lease.
func (f *fixture) outcome(t *testing.T, job, attemptID string) attempts.Outcome {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, "outcome of "+job+"/"+attemptID, func() bool { return len(f.outcomesOf(job, attemptID)) > 0 })
	got := f.outcomesOf(job, attemptID)
	if len(got) != 1 {
		t.Fatalf("%d outcomes of %s/%s, want 1", len(got), job, attemptID)
	}
	return got[0]
}

func TestCancelOnlyTheMatchingAttempt(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	ctx := context.Background()
	f.start(ctx, assign("job-1", "att-1", typeBlock, `{}`))
	f.start(ctx, assign("job-1", "att-2", typeBlock, `{}`)) // a newer attempt of the same job
	f.start(ctx, assign("job-2", "att-1", typeBlock, `{}`))
	for _, miss := range []attempts.Lease{
		{JobID: "job-1", AttemptID: "att-3"}, // right job, attempt not running
		{JobID: "job-3", AttemptID: "att-1"}, // right attempt id, other job
		{JobID: "job-1"},                     // job id alone
	} {
		if f.set.Cancel(miss.JobID, miss.AttemptID) {
			t.Errorf("Cancel(%q, %q) = true for no running attempt", miss.JobID, miss.AttemptID)
		}
	}
	if !f.set.Cancel("job-1", "att-1") {
		t.Fatal("Cancel of the running attempt = false")
	}
	if o := f.outcome(t, "job-1", "att-1"); !errors.Is(o.Err, attempts.ErrCancelled) {
		t.Errorf("cancelled attempt's outcome = %+v, want ErrCancelled", o)
	}
	testkit.Eventually(t, 10*time.Second, "cancelled attempt forgotten", func() bool { return f.set.Len() == 2 })
	if n := len(f.outcomesOf("job-1", "att-2")) + len(f.outcomesOf("job-2", "att-1")); n != 0 {
		t.Errorf("%d outcomes of attempts that were not cancelled", n)
	}
	if !f.logs.has("cancel ignored: attempt not running") || !f.logs.has("attempt cancelled") {
		t.Error("cancels not logged")
	}
}

// TestCancelBeforeItsAssignment: a cancel may overtake its assignment on the way; the
// attempt then never runs, while other attempts, and leases cancelled long before
// (more than the Set keeps), still do.
func TestCancelBeforeItsAssignment(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	ctx := context.Background()
	if f.set.Cancel("job-c", "att-c") {
		t.Fatal("Cancel = true for an attempt not yet assigned")
	}
	if f.start(ctx, assign("job-c", "att-c", typeEcho, `"ran"`)) {
		t.Error("Start of an attempt whose cancel came first = true")
	}
	if !f.logs.has("assignment ignored: its cancel came first") {
		t.Error("the ignored assignment was not logged")
	}
	if !f.start(ctx, assign("job-c", "att-c2", typeEcho, `"next"`)) {
		t.Error("Start of the job's next attempt = false")
	}
	if o := f.outcome(t, "job-c", "att-c2"); o.Result != `"next"` {
		t.Errorf("next attempt's outcome = %+v", o)
	}
	for i := range 100 { // many more cancels of attempts that ended: the oldest is forgotten
		f.set.Cancel("job-old", fmt.Sprint("att-", i))
	}
	if !f.start(ctx, assign("job-old", "att-0", typeEcho, `"late"`)) {
		t.Error("Start of a lease cancelled 100 cancels ago = false; the Set keeps only the newest")
	}
	if n := len(f.outcomesOf("job-c", "att-c")); n != 0 {
		t.Errorf("%d outcomes of the attempt cancelled before it came", n)
	}
}

func TestDuplicateIgnored(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	ctx := context.Background()
	if !f.start(ctx, assign("job-d", "att-d", typeIgnore, `{}`)) {
		t.Fatal("first Start = false")
	}
	if f.start(ctx, assign("job-d", "att-d", typeEcho, `"second"`)) {
		t.Error("duplicate Start = true")
	}
	if n := f.set.Len(); n != 1 {
		t.Errorf("Len = %d after a duplicate, want 1", n)
	}
	if !f.logs.has("duplicate assignment ignored") {
		t.Error("duplicate not logged")
	}
	f.set.Cancel("job-d", "att-d")
	if o := f.outcome(t, "job-d", "att-d"); o.Result != "done anyway" {
		t.Errorf("outcome = %+v, want the first attempt's", o)
	}
	// Once it has ended, the same lease is a new attempt again.
	testkit.Eventually(t, 10*time.Second, "attempt forgotten", func() bool { return f.set.Len() == 0 })
	if !f.start(ctx, assign("job-d", "att-d", typeEcho, `"again"`)) {
		t.Error("Start after the attempt ended = false")
	}
	testkit.Eventually(t, 10*time.Second, "second outcome", func() bool { return len(f.outcomesOf("job-d", "att-d")) == 2 })
}

func TestBeyondCapacityRuns(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	ctx := context.Background()
	f.start(ctx, assign("job-a", "a", typeBlock, `{}`))
	if !f.start(ctx, assign("job-b", "a", typeBlock, `{}`)) {
		t.Fatal("Start beyond capacity = false")
	}
	if n := f.set.Len(); n != 2 {
		t.Errorf("Len = %d, want 2", n)
	}
	if !f.logs.has("assignment beyond capacity") {
		t.Error("no warning for an assignment beyond capacity")
	}
}

func TestShutdownCancelsAllAndRefusesNew(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	ctx := context.Background()
	f.start(ctx, assign("job-1", "a", typeBlock, `{}`))
	f.start(ctx, assign("job-2", "a", typeBlock, `{}`))
	f.set.Cancel("job-2", "a") // already cancelled: keeps its first cause
	stop := errors.New("stopping")
	if n := f.set.Shutdown(stop); n < 1 || n > 2 {
		t.Errorf("Shutdown = %d, want the attempts still running", n)
	}
	if f.start(ctx, assign("job-3", "a", typeEcho, `1`)) {
		t.Error("Start after Shutdown = true")
	}
	f.set.Wait()
	if o := f.outcome(t, "job-1", "a"); !errors.Is(o.Err, stop) {
		t.Errorf("outcome = %+v, want the shutdown cause", o)
	}
	if o := f.outcome(t, "job-2", "a"); !errors.Is(o.Err, attempts.ErrCancelled) {
		t.Errorf("outcome of the cancelled attempt = %+v, want ErrCancelled", o)
	}
	if n := f.set.Len(); n != 0 {
		t.Errorf("Len = %d after Wait", n)
	}
	if n := f.set.Shutdown(stop); n != 0 {
		t.Errorf("second Shutdown = %d, want 0", n)
	}
	if !f.logs.has("assignment ignored: worker stopping") {
		t.Error("refused assignment not logged")
	}
}

func TestCancelBeforeGeneration(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	ctx := context.Background()
	f.start(ctx, assign("job-old", "a", typeBlock, `{}`)) // generation 0
	gen := f.set.NextGeneration()
	if gen != 1 {
		t.Errorf("NextGeneration = %d, want 1", gen)
	}
	f.start(ctx, assign("job-new", "a", typeBlock, `{}`))
	old := errors.New("old generation")
	if n := f.set.CancelBefore(gen, old); n != 1 {
		t.Errorf("CancelBefore = %d, want 1", n)
	}
	if o := f.outcome(t, "job-old", "a"); !errors.Is(o.Err, old) {
		t.Errorf("outcome = %+v, want the cause given", o)
	}
	testkit.Eventually(t, 10*time.Second, "old attempt forgotten", func() bool { return f.set.Len() == 1 })
	if n := len(f.outcomesOf("job-new", "a")); n != 0 {
		t.Errorf("%d outcomes of the current generation's attempt", n)
	}
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	parentCause := errors.New("connection lost")
	for _, tc := range []struct {
		name      string
		taskType  string
		payload   string
		endParent bool // end the parent context with parentCause once started
		result    string
		err       string // text of the error, "" for success
		errIs     error
	}{
		{name: "Success", taskType: typeEcho, payload: `"hi"`, result: `"hi"`},
		{name: "PanicFails", taskType: typePanic, payload: `{}`, err: "task PANIC panicked: kaboom"},
		{name: "UnknownTaskFails", taskType: "NOPE", payload: `{}`, err: "unknown task type", errIs: tasks.ErrUnknownTask},
		{name: "ParentCauseReplacesError", taskType: typeBlock, payload: `{}`, endParent: true,
			err: "connection lost", errIs: parentCause},
		{name: "SuccessAfterCancelKept", taskType: typeIgnore, payload: `{}`, endParent: true, result: "done anyway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, 4)
			parent, end := context.WithCancelCause(context.Background())
			defer end(nil)
			m := assign("job", "att", tc.taskType, tc.payload)
			f.start(parent, m)
			if tc.endParent {
				end(parentCause)
			}
			o := f.outcome(t, "job", "att")
			if tc.errIs != nil && !errors.Is(o.Err, tc.errIs) {
				t.Errorf("Err = %v, want %v", o.Err, tc.errIs)
			}
			res := attempts.Result("w-1", m, o)
			if res.WorkerID != "w-1" || res.JobID != "job" || res.AttemptID != "att" {
				t.Errorf("result lease = %+v", res)
			}
			switch {
			case tc.err == "":
				if !res.Success || res.Result == nil || *res.Result != tc.result || res.Error != nil {
					t.Errorf("result = %+v, want success %q", res, tc.result)
				}
			default:
				if res.Success || res.Result != nil || res.Error == nil || !strings.Contains(*res.Error, tc.err) {
					t.Errorf("result = %+v, want failure %q", res, tc.err)
				}
			}
		})
	}
}

func TestPanicLogged(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	f.start(context.Background(), assign("job-p", "a", typePanic, `{}`))
	f.outcome(t, "job-p", "a")
	if !f.logs.has("task panicked") {
		t.Error("panic not logged")
	}
}

// TestGoexitEndsTheAttempt: a task that ends its goroutine without returning
// (runtime.Goexit) fails its attempt as a panic does: its outcome is delivered and the
// attempt no longer counts as running. Before, the Set kept it running for ever and
// delivered nothing: the worker reported it held (so the coordinator kept the job
// RUNNING until its deadline), counted it against its capacity, and a Drain never
// ended.
func TestGoexitEndsTheAttempt(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	f.start(context.Background(), assign("job-x", "a", typeGoexit, `{}`))
	o := f.outcome(t, "job-x", "a")
	if o.Err == nil || !strings.Contains(o.Err.Error(), "Goexit") {
		t.Errorf("outcome = %+v, want a failure that names runtime.Goexit", o)
	}
	testkit.Eventually(t, 10*time.Second, "attempt no longer running", func() bool { return f.set.Len() == 0 })
	// The Set runs attempts on afterwards.
	f.start(context.Background(), assign("job-y", "a", typeEcho, `"after"`))
	if o := f.outcome(t, "job-y", "a"); o.Err != nil || o.Result != `"after"` {
		t.Errorf("outcome after = %+v", o)
	}
}

func TestWaitWaitsForDone(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	release := make(chan struct{})
	var returned bool // written by done, read after Wait: the race detector checks the order
	m := assign("job-w", "a", typeEcho, `1`)
	f.set.Start(context.Background(), m, finishFunc(func(attempts.Outcome) {
		<-release
		returned = true
	}))
	waited := make(chan struct{})
	go func() {
		f.set.Wait()
		close(waited)
	}()
	select {
	case <-waited:
		t.Fatal("Wait returned while done was blocked")
	default:
	}
	close(release)
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
	}
	if !returned {
		t.Error("Wait returned before done did")
	}
	// done runs after the attempt stopped counting as running.
	if n := f.set.Len(); n != 0 {
		t.Errorf("Len = %d after Wait", n)
	}
}

// BenchmarkStartResult is an attempt's path through a Set: started, its task run on a
// pooled goroutine, its outcome turned into a result.
func BenchmarkStartResult(b *testing.B) {
	r := tasks.NewRegistry()
	if err := r.Register(typeEcho, task(func(context.Context, json.RawMessage) (string, error) { return "ok", nil })); err != nil {
		b.Fatal(err)
	}
	set := attempts.New(r, 64, slog.New(slog.DiscardHandler))
	defer func() {
		set.Shutdown(errors.New("done"))
		set.Wait()
	}()
	results := make(chan *protocol.TaskResult, 1)
	m := assign("job-1", "att-1", typeEcho, `{}`)
	done := finishFunc(func(o attempts.Outcome) { results <- attempts.Result("w", m, o) })
	for b.Loop() {
		if !set.Start(context.Background(), m, done) {
			b.Fatal("not started")
		}
		<-results
	}
}

// slotted is a Finisher that holds its attempt's Slot, as the native worker's does.
type slotted struct {
	slot     attempts.Slot
	outcomes chan attempts.Outcome
}

func (s *slotted) AttemptSlot() *attempts.Slot { return &s.slot }
func (s *slotted) Finish(o attempts.Outcome)   { s.outcomes <- o }
func newSlotted() *slotted                     { return &slotted{outcomes: make(chan attempts.Outcome, 1)} }
func (s *slotted) outcome(t *testing.T) attempts.Outcome {
	t.Helper()
	select {
	case o := <-s.outcomes:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome")
		return attempts.Outcome{}
	}
}

// TestSlotHolder: attempts whose Finisher holds their Slot run, cancel and refuse
// duplicates as any other: the Set's record lives in the Slot.
func TestSlotHolder(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	ctx := context.Background()
	a, b, dup := newSlotted(), newSlotted(), newSlotted()
	if !f.set.Start(ctx, assign("job-1", "att-1", typeBlock, `{}`), a) || !f.set.Start(ctx, assign("job-2", "att-1", typeEcho, `"hi"`), b) {
		t.Fatal("Start = false")
	}
	if f.set.Start(ctx, assign("job-1", "att-1", typeBlock, `{}`), dup) {
		t.Error("duplicate started")
	}
	if o := b.outcome(t); o.Err != nil || o.Result != `"hi"` {
		t.Errorf("echo outcome %+v", o)
	}
	if !f.set.Cancel("job-1", "att-1") {
		t.Fatal("Cancel = false")
	}
	if o := a.outcome(t); !errors.Is(o.Err, attempts.ErrCancelled) {
		t.Errorf("cancelled outcome %+v, want ErrCancelled", o)
	}
	testkit.Eventually(t, 10*time.Second, "attempts forgotten", func() bool { return f.set.Len() == 0 })
}

// finishFunc is a function as an attempts.Finisher.
type finishFunc func(attempts.Outcome)

func (f finishFunc) Finish(o attempts.Outcome) { f(o) }

// scopedErr is a task's error that reads state its attempt holds, as one whose text
// comes from a buffer the task returns to its pool once the attempt's context ends
// (context.AfterFunc): read after that, it panics.
type scopedErr struct{ ctx context.Context }

func (e scopedErr) Error() string {
	if e.ctx.Err() != nil {
		panic("error read after its attempt ended")
	}
	return "scoped failure"
}

func (e scopedErr) Is(target error) bool {
	if e.ctx.Err() != nil {
		panic("error read after its attempt ended")
	}
	return target == tasks.ErrPermanent
}

// TestTaskErrorReadOnce: a task's error is read for its attempt's result once, under
// the task's recover, while the attempt runs: the result says what it said then, and
// making it reads the error no more. Before, runTask read it to catch its panics, and
// the result read it again, after the attempt ended and outside any recover: an error
// that panicked only then ended the worker process (here, Result panicked in Finish).
func TestTaskErrorReadOnce(t *testing.T) {
	t.Parallel()
	r := registry(t)
	if err := r.Register("SCOPED", task(func(ctx context.Context, _ json.RawMessage) (string, error) {
		return "", scopedErr{ctx}
	})); err != nil {
		t.Fatal(err)
	}
	set := attempts.New(r, 1, slog.New(slog.NewTextHandler(&logs{}, nil)))
	t.Cleanup(func() {
		set.Shutdown(errors.New("test over"))
		set.Wait()
	})
	m := assign("job-s", "a", "SCOPED", `{}`)
	got := make(chan any, 1)
	set.Start(context.Background(), m, finishFunc(func(o attempts.Outcome) {
		defer func() {
			if r := recover(); r != nil {
				got <- fmt.Sprintf("Result panicked: %v", r)
			}
		}()
		got <- attempts.Result("w-1", m, o)
	}))
	select {
	case g := <-got:
		res, ok := g.(*protocol.TaskResult)
		if !ok {
			t.Fatal(g)
		}
		if res.Success || res.Error == nil || *res.Error != "scoped failure" || !res.Permanent {
			t.Errorf("result = %+v, want the permanent failure \"scoped failure\"", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome")
	}
}
