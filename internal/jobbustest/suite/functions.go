package suite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tasks"
)

// The functions suite: task types of the workers' own, declared with a JSON Schema,
// catalogued by the coordinator, validated before the job exists and routed only to
// the workers that serve them. Test-driven peers declare types over the transport's
// worker side (the bus, or WORKER_REGISTER's taskTypes on the TCP port); real workers
// with handlers are native (worker.Handle), beside the transport's own.

// functions is the suite: each test gets a system of its own.
var functions = []struct {
	name string
	test func(t *testing.T, tr Transport)
}{
	{"SchemaValidation", testSchemaValidation},
	{"RoutesOnlyToWorkersServingTheType", testRoutesByType},
	{"TypeOptionsDeadlineAndRetry", testTypeOptions},
	{"CancelCustomJob", testCancelCustom},
	{"HandlersEndToEnd", testHandlers},
	{"ConcurrencyLimitHolds", testConcurrencyLimit},
	{"RestartKeepsCatalogueAndJobs", testRestartKeepsCatalogue},
}

// RunFunctions runs the functions suite over tr, each test as a parallel subtest.
func RunFunctions(t *testing.T, tr Transport) {
	t.Helper()
	for _, ft := range functions {
		t.Run(ft.name, func(t *testing.T) {
			t.Parallel()
			ft.test(t, tr)
		})
	}
}

// TextReverse is the suite's task type: {"text": string}, required, at most 10
// characters.
const TextReverse = "TEXT_REVERSE"

// TextReverseDecl declares TextReverse with opts.
func TextReverseDecl(opts protocol.TaskTypeOptions) protocol.TaskTypeDecl {
	return protocol.TaskTypeDecl{Name: TextReverse, Declared: true, Options: opts,
		Schema: json.RawMessage(`{"type":"object","required":["text"],"properties":{"text":{"type":"string","maxLength":10}}}`)}
}

type reverseArgs struct {
	Text string `json:"text" jsonschema:"maxLength=10"`
}

func reverse(_ context.Context, _ int, a reverseArgs) (string, error) {
	r := []rune(a.Text)
	slices.Reverse(r)
	return string(r), nil
}

// SubmitError submits a job that must be refused, and returns the ERROR's text.
func (s *System) SubmitError(taskType string, payload any) string {
	s.t.Helper()
	id, err := s.Client.Submit(context.Background(), taskType, payload)
	var se *client.ServerError
	if !errors.As(err, &se) {
		s.t.Fatalf("submit %s %v: job %q, error %v; want an ERROR", taskType, payload, id, err)
	}
	return se.Message
}

func testSchemaValidation(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	s.ManualWorker("fn", 1).RegisterServing(1, TextReverseDecl(protocol.TaskTypeOptions{}))
	for _, tc := range []struct {
		name, taskType string
		payload        any
		want           string
	}{
		{"MissingField", TextReverse, RawJSON(`{}`), "Invalid payload: missing property 'text'"},
		{"WrongType", TextReverse, RawJSON(`{"text":5}`), "Invalid payload: at '/text': got number, want string"},
		{"TooLong", TextReverse, Text("abcdefghijk"), "Invalid payload: at '/text': maxLength: got 11, want 10"},
		{"NotAnObject", TextReverse, RawJSON(`["text"]`), "Invalid payload: Payload must be a JSON object"},
		{"Null", TextReverse, RawJSON(`null`), "Invalid payload: Payload must be a JSON object"},
		{"UnknownType", "NOPE", RawJSON(`{}`), "Unknown task type: NOPE"},
		{"CaseMatters", "text_reverse", Text("a"), "Unknown task type: text_reverse"},
		// The built-ins keep PROTOCOL.md's texts.
		{"BuiltinRange", "SLEEP", RawJSON(`{"durationMillis":700000}`), "Invalid payload: Field 'durationMillis' must be in [0, 600000], got 700000"},
		{"BuiltinString", "SHA256", RawJSON(`{"text":5}`), "Invalid payload: Field 'text' must be a string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.SubmitError(tc.taskType, tc.payload); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	// Ten characters outside the BMP are ten code points, as JSON Schema counts.
	if id := s.Submit(TextReverse, Text(strings.Repeat("😀", 10))); s.Status(id).State != protocol.StateQueued &&
		s.Status(id).State != protocol.StateRunning {
		t.Fatalf("valid job %+v", s.Status(id))
	}
}

func testRoutesByType(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	plain := s.ManualWorker("plain", 4) // the built-ins, and more free slots than fn
	fn := s.tr.Peer(s, "fn")
	fn.RegisterServing(1, TextReverseDecl(protocol.TaskTypeOptions{}))
	first := s.Submit(TextReverse, Text("abc"))
	a := s.NextAssign(fn)
	if a.JobID != first || a.TaskType != TextReverse || string(a.Payload) != `{"text":"abc"}` {
		t.Fatalf("fn got %+v, want job %s", a, first)
	}
	second := s.Submit(TextReverse, Text("def")) // fn is full: it waits
	sha := s.Submit("SHA256", Text("x"))         // ... without holding back other types
	if b := s.NextAssign(plain); b.JobID != sha {
		t.Fatalf("plain got %+v, want the SHA256 job %s", b, sha)
	}
	if j := s.Status(second); j.State != protocol.StateQueued {
		t.Fatalf("second job %+v, want QUEUED while fn is busy", j)
	}
	s.Accept(fn, a, true, "cba")
	if b := s.NextAssign(fn); b.JobID != second {
		t.Fatalf("fn got %+v, want job %s", b, second)
	}
	select {
	case b := <-plain.Assignments():
		t.Fatalf("a worker of the built-ins got %+v", b)
	default:
	}
	if j := s.Status(first); j.State != protocol.StateCompleted || Deref(j.Result) != "cba" || Deref(j.WorkerID) != "<nil>" {
		t.Fatalf("first job %+v", j)
	}
}

func testTypeOptions(t *testing.T, tr Transport) {
	// The coordinator's clock moves only when the test moves it: the first attempt's
	// deadline passes when the test says, and the second is answered within its own
	// however slow the machine, by a worker that is not lost meanwhile.
	clk := jobbustest.NewClock(time.Now())
	s := Setup(t, tr, func(c *coordinator.Config) { c.Now, c.HeartbeatTimeout = clk.Now, 48*time.Hour })
	fn := s.ManualWorker("fn", 1)
	fn.RegisterServing(1, TextReverseDecl(protocol.TaskTypeOptions{MaxAttempts: 2, TimeoutMillis: 500}))
	id := s.Submit(TextReverse, Text("abc")) // maxAttempts 0: the type's 2
	if j := s.Status(id); j.MaxAttempts != 2 {
		t.Fatalf("job %+v, want the type's 2 attempts", j)
	}
	first := s.NextAssign(fn) // never answered: its 500 ms deadline passes
	clk.Advance(time.Second)
	if c := s.NextCancel(fn); c.JobID != id || c.AttemptID != first.AttemptID {
		t.Fatalf("cancel %+v, want job %s attempt %s", c, id, first.AttemptID)
	}
	if j := s.Status(id); !strings.HasPrefix(Deref(j.Error), "execution deadline exceeded (500 ms) on worker fn") {
		t.Fatalf("job %+v error %q, want the type's 500 ms deadline", j, Deref(j.Error))
	}
	clk.Advance(time.Second) // past the retry delay, not past the second attempt's deadline
	second := s.NextAssign(fn)
	s.Accept(fn, second, false, "boom")
	if second.AttemptNumber != 2 {
		t.Fatalf("assignment %+v, want attempt 2", second)
	}
	if j := s.WaitState(id, protocol.StateFailed); Deref(j.Error) != "boom (all 2 attempts used)" {
		t.Fatalf("job error %q, want the second attempt's, answered within the type's 500 ms", Deref(j.Error))
	}
	// A submission's own maxAttempts wins over the type's.
	if j := s.Status(s.Submit(TextReverse, Text("x"), client.MaxAttempts(5))); j.MaxAttempts != 5 {
		t.Fatalf("job %+v, want its own 5 attempts", j)
	}
}

func testCancelCustom(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	fn := s.ManualWorker("fn", 1)
	fn.RegisterServing(1, TextReverseDecl(protocol.TaskTypeOptions{}))
	id := s.Submit(TextReverse, Text("abc"))
	a := s.NextAssign(fn)
	cancelled, j, err := s.Client.Cancel(context.Background(), id)
	if err != nil || !cancelled || j.State != protocol.StateCancelled {
		t.Fatalf("cancel: %v %+v %v", cancelled, j, err)
	}
	if c := s.NextCancel(fn); c.AttemptID != a.AttemptID {
		t.Fatalf("cancel %+v, want attempt %s", c, a.AttemptID)
	}
	queued := s.Submit(TextReverse, Text("def")) // the slot is free again
	s.Reject(fn, a, true, "too late")
	if b := s.NextAssign(fn); b.JobID != queued {
		t.Fatalf("fn got %+v, want job %s", b, queued)
	}
}

// testHandlers runs real native workers with handlers beside the transport's own
// built-in workers: typed handlers, retried and permanent failures, a deadline, a
// cancel.
func testHandlers(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	s.StartWorker(2) // the transport's worker of the built-ins
	started := make(chan struct{}, 10)
	s.StartFunctionWorker(t, func(w *worker.Worker) error {
		return errors.Join(
			worker.HandleJSON(w, TextReverse, reverse),
			w.Handle("CHECKOUT", func(_ context.Context, attempt int, payload json.RawMessage) (string, error) {
				var p struct{ Card string }
				_ = json.Unmarshal(payload, &p)
				switch {
				case p.Card == "declined":
					return "", worker.Permanent(errors.New("card declined"))
				case attempt == 1:
					return "", errors.New("gateway timeout")
				}
				return "paid on attempt " + fmt.Sprint(attempt), nil
			}, worker.MaxAttempts(3)),
			w.Handle("BLOCK", func(ctx context.Context, _ int, _ json.RawMessage) (string, error) {
				started <- struct{}{}
				<-ctx.Done()
				return "", ctx.Err()
			}, worker.Timeout(300*time.Millisecond), worker.MaxAttempts(1)),
		)
	}, worker.WithTasks(tasks.NewRegistry()), worker.WithID("fn"), worker.WithCapacity(4))
	s.Eventually("fn registered", func() bool { return s.HasWorker("fn") })

	if j := s.Wait(s.Submit(TextReverse, Text("héllo 👋"))); j.State != protocol.StateCompleted || Deref(j.Result) != "👋 olléh" || j.Attempts != 1 {
		t.Fatalf("TEXT_REVERSE %+v result %q", j, Deref(j.Result))
	}
	if j := s.Wait(s.Submit("CHECKOUT", RawJSON(`{"card":"ok"}`))); j.State != protocol.StateCompleted || Deref(j.Result) != "paid on attempt 2" {
		t.Fatalf("CHECKOUT retried %+v result %q", j, Deref(j.Result))
	}
	if j := s.Wait(s.Submit("CHECKOUT", RawJSON(`{"card":"declined"}`))); j.State != protocol.StateFailed || j.Attempts != 1 ||
		Deref(j.Error) != "card declined (permanent failure on attempt 1 of 3; not retried)" {
		t.Fatalf("CHECKOUT declined %+v error %q", j, Deref(j.Error))
	}
	if j := s.Wait(s.Submit("BLOCK", RawJSON(`{}`))); j.State != protocol.StateFailed ||
		Deref(j.Error) != "execution deadline exceeded (300 ms) on worker fn (all 1 attempts used)" {
		t.Fatalf("BLOCK %+v error %q", j, Deref(j.Error))
	}
	<-started
	id := s.Submit("BLOCK", RawJSON(`{}`))
	<-started
	if cancelled, _, err := s.Client.Cancel(context.Background(), id); err != nil || !cancelled {
		t.Fatalf("cancel BLOCK: %v %v", cancelled, err)
	}
	// Built-ins still run on the transport's worker, never on fn, which lacks them.
	if j := s.Wait(s.Submit("WORD_COUNT", Text("a b c"))); j.State != protocol.StateCompleted || Deref(j.Result) != "3" {
		t.Fatalf("WORD_COUNT %+v", j)
	}
}

// testConcurrencyLimit runs more jobs of a type limited to 3 than its workers have
// slots, and checks that the handlers never ran more than 3 at once, and did run 3.
func testConcurrencyLimit(t *testing.T, tr Transport) {
	const limit, jobs = 3, 40
	// The limit counts live leases. A worker lost while it runs an attempt (a heartbeat
	// late on a loaded machine) may still run it when the coordinator retries the job
	// elsewhere: at-least-once, not a broken limit. The suite's heartbeat timeout of a
	// minute keeps the workers, so the handlers' count is the leases' count.
	s := Setup(t, tr)
	var mu sync.Mutex
	inFlight, maxSeen := 0, 0
	// The first jobs hold their slots until every job is submitted, so the limit is
	// reached whatever the machine's speed; then each runs for a few milliseconds.
	gate := make(chan struct{})
	retried := 0
	limited := func(ctx context.Context, attempt int, _ json.RawMessage) (string, error) {
		mu.Lock()
		inFlight++
		if attempt > 1 {
			retried++
		}
		maxSeen = max(maxSeen, inFlight)
		mu.Unlock()
		defer func() { mu.Lock(); inFlight--; mu.Unlock() }()
		select {
		case <-gate:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		select {
		case <-time.After(5 * time.Millisecond):
			return "done", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	for i := range 3 { // 12 slots for a limit of 3
		s.StartFunctionWorker(t, func(w *worker.Worker) error {
			return w.Handle("LIMITED", limited, worker.Concurrency(limit))
		}, worker.WithID(fmt.Sprintf("fn-%d", i)), worker.WithCapacity(4))
	}
	for i := range 3 {
		s.Eventually("fn registered", func() bool { return s.HasWorker(fmt.Sprintf("fn-%d", i)) })
	}
	ids := make([]string, 0, jobs+5)
	for range jobs {
		ids = append(ids, s.Submit("LIMITED", RawJSON(`{}`)))
	}
	s.StartWorker(2)   // the transport's worker of the built-ins
	for i := range 5 { // other types go past the limited queue, on the free slots
		id := s.Submit("SHA256", Text(fmt.Sprint(i)))
		if j := s.Wait(id); j.State != protocol.StateCompleted {
			t.Fatalf("SHA256 job %+v, while the limited type waits", j)
		}
	}
	close(gate)
	for _, id := range ids {
		if j := s.Wait(id); j.State != protocol.StateCompleted {
			t.Fatalf("job %+v", j)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("max observed in flight %d, limit %d (%d jobs, %d attempts retried)", maxSeen, limit, jobs, retried)
	if maxSeen != limit {
		t.Fatalf("max observed in flight %d, want the limit %d", maxSeen, limit)
	}
}

func testRestartKeepsCatalogue(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	fn := s.ManualWorker("fn", 1)
	fn.RegisterServing(1, TextReverseDecl(protocol.TaskTypeOptions{MaxAttempts: 4}))
	fn.Disconnect()
	s.Eventually("fn gone", func() bool { return !s.HasWorker("fn") })
	before := s.Submit(TextReverse, Text("abc")) // no live worker of the type: it waits
	s.RestartCoordinator(t)
	if j := s.Status(before); j.State != protocol.StateQueued || j.MaxAttempts != 4 {
		t.Fatalf("after restart %+v, want QUEUED with the type's 4 attempts", j)
	}
	after := s.Submit(TextReverse, Text("def"))
	if got, want := s.SubmitError(TextReverse, RawJSON(`{}`)), "Invalid payload: missing property 'text'"; got != want {
		t.Fatalf("after restart got %q, want %q", got, want)
	}
	types, err := s.Client.TaskTypes(context.Background())
	Must(t, err)
	i := slices.IndexFunc(types, func(ti protocol.TaskTypeInfo) bool { return ti.Name == TextReverse })
	if i < 0 || types[i].Builtin || len(types[i].Workers) != 0 || types[i].Queued != 2 || types[i].Options.MaxAttempts != 4 || types[i].LastServedMillis == 0 {
		t.Fatalf("catalogue after restart: %+v", types)
	}
	s.StartFunctionWorker(t, func(w *worker.Worker) error { return worker.HandleJSON(w, TextReverse, reverse) },
		worker.WithTasks(tasks.NewRegistry()))
	for id, want := range map[string]string{before: "cba", after: "fed"} {
		if j := s.Wait(id); j.State != protocol.StateCompleted || Deref(j.Result) != want {
			t.Fatalf("job %+v result %q, want %q", j, Deref(j.Result), want)
		}
	}
}
