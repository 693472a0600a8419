package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tasks"
)

type reverseArgs struct {
	Text  string   `json:"text" jsonschema:"maxLength=10000"`
	Times int      `json:"times,omitempty" jsonschema:"minimum=1"`
	Tags  []string `json:"tags,omitempty"`
}

func reverse(_ context.Context, _ int, a reverseArgs) (string, error) {
	r := []rune(a.Text)
	slices.Reverse(r)
	return string(r), nil
}

func TestSchemaFor(t *testing.T) {
	t.Parallel()
	got, err := worker.SchemaFor[reverseArgs]()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"properties":{"text":{"type":"string","maxLength":10000},"times":{"type":"integer","minimum":1},` +
		`"tags":{"items":{"type":"string"},"type":"array"}},"type":"object","required":["text"]}`
	if string(got) != want {
		t.Fatalf("schema\n got %s\nwant %s", got, want)
	}
	if _, err := worker.SchemaFor[string](); err == nil {
		t.Fatal("a string payload type was accepted: payloads are JSON objects")
	}
}

func TestHandleRefuses(t *testing.T) {
	t.Parallel()
	ok := func(context.Context, int, json.RawMessage) (string, error) { return "", nil }
	cases := []struct {
		name string
		do   func(w *worker.Worker) error
		want error
	}{
		{"NilHandler", func(w *worker.Worker) error { return w.Handle("X", nil) }, worker.ErrBadHandler},
		{"BadName", func(w *worker.Worker) error { return w.Handle("a b", ok) }, worker.ErrBadHandler},
		{"NegativeConcurrency", func(w *worker.Worker) error { return w.Handle("X", ok, worker.Concurrency(-1)) }, worker.ErrBadHandler},
		{"NotAStruct", func(w *worker.Worker) error {
			return worker.HandleJSON(w, "X", func(context.Context, int, []int) (string, error) { return "", nil })
		}, worker.ErrBadHandler},
		{"Twice", func(w *worker.Worker) error { _ = w.Handle("X", ok); return w.Handle("X", ok) }, tasks.ErrDuplicateTask},
		{"BuiltinName", func(w *worker.Worker) error { return w.Handle(tasks.TypeSleep, ok) }, tasks.ErrDuplicateTask},
	}
	url := startServer(t).ClientURL()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w, err := worker.Connect(context.Background(), url, worker.WithLogger(nil))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			err = tc.do(w)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestHandleAfterRunIsRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{})
	f.waitRegistered(t, 1)
	err := f.w.Handle("LATE", func(context.Context, int, json.RawMessage) (string, error) { return "", nil })
	if !errors.Is(err, worker.ErrBadHandler) {
		t.Fatalf("Handle after Run: %v", err)
	}
}

// TestHandlersDeclareAndRun: a worker with handlers declares its types when it
// registers, runs their assignments, and reports a permanent failure as one.
func TestHandlersDeclareAndRun(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{opts: []worker.Option{worker.WithTasks(tasks.NewRegistry())}, handle: func(w *worker.Worker) error {
		return errors.Join(
			worker.HandleJSON(w, "TEXT_REVERSE", reverse, worker.MaxAttempts(2), worker.Timeout(1500*time.Millisecond), worker.Concurrency(3),
				worker.ConcurrencyKeyFrom("/text"), worker.KeyConcurrency(2)),
			w.Handle("CHARGE", func(_ context.Context, attempt int, payload json.RawMessage) (string, error) {
				if strings.Contains(string(payload), "declined") {
					return "", fmt.Errorf("charge: %w", worker.ErrPermanent)
				}
				return "", worker.Permanent(fmt.Errorf("attempt %d: card expired", attempt))
			}, worker.Schema(json.RawMessage(`{"type":"object"}`))),
			w.Handle("POLL", func(context.Context, int, json.RawMessage) (string, error) {
				return "", fmt.Errorf("not ready: %w", worker.Snooze(1500*time.Millisecond))
			}, worker.Schema(json.RawMessage(`{"type":"object"}`))),
		)
	}})
	f.waitRegistered(t, 1)
	reg := f.coord.registered()[0]
	want := []protocol.TaskTypeDecl{
		{Name: "CHARGE", Schema: json.RawMessage(`{"type":"object"}`), Declared: true},
		{Name: "POLL", Schema: json.RawMessage(`{"type":"object"}`), Declared: true},
		{Name: "TEXT_REVERSE", Declared: true, Options: protocol.TaskTypeOptions{MaxAttempts: 2, TimeoutMillis: 1500, Concurrency: 3, ConcurrencyKey: "/text", KeyConcurrency: 2}},
	}
	if len(reg.TaskTypes) != len(want) {
		t.Fatalf("declared %+v", reg.TaskTypes)
	}
	for i, d := range reg.TaskTypes {
		if d.Name != want[i].Name || !d.Declared || d.Options != want[i].Options || len(d.Schema) == 0 {
			t.Errorf("declaration %d = %+v, want %+v", i, d, want[i])
		}
	}
	if !strings.Contains(string(reg.TaskTypes[2].Schema), `"maxLength":10000`) {
		t.Errorf("TEXT_REVERSE schema %s, want the one derived from its struct", reg.TaskTypes[1].Schema)
	}

	id := f.w.ID()
	for _, tc := range []struct {
		job, taskType, payload string
		success, permanent     bool
		text                   string
		snoozeMillis           int64
	}{
		{"j1", "TEXT_REVERSE", `{"text":"abc 👋"}`, true, false, "👋 cba", 0},
		{"j2", "TEXT_REVERSE", `{"text":5}`, false, true, "decode payload: json: cannot unmarshal number into Go struct field reverseArgs.text of type string", 0},
		{"j3", "CHARGE", `{"card":"declined"}`, false, true, "charge: permanent failure", 0},
		{"j4", "CHARGE", `{}`, false, true, "attempt 1: card expired", 0},
		{"j5", tasks.TypeSHA256, `{"text":""}`, false, false, "unknown task type 'SHA256' (known: CHARGE, POLL, TEXT_REVERSE)", 0},
		{"j6", "POLL", `{}`, false, false, "not ready: snoozed for 1.5s", 1500},
	} {
		f.coord.assign(t, id, tc.job, "a1", tc.taskType, tc.payload)
		r := f.coord.result(t, tc.job, "a1")
		text := r.Result
		if !tc.success {
			text = r.Error
		}
		if r.Success != tc.success || r.Permanent != tc.permanent || r.SnoozeMillis != tc.snoozeMillis || text == nil || *text != tc.text {
			t.Errorf("%s %s: result %+v (text %q), want success %v permanent %v snooze %d ms %q", tc.job, tc.taskType, r, deref(text), tc.success, tc.permanent, tc.snoozeMillis, tc.text)
		}
	}
}

// treeNode is a payload type that contains itself, as a tree's does.
type treeNode struct {
	Name     string     `json:"name" jsonschema:"minLength=1"`
	Children []treeNode `json:"children,omitempty"`
	Parent   *treeNode  `json:"parent,omitempty"`
}

// TestHandleJSONRecursiveType: a payload type that contains itself registers (its
// schema refers to its own definition rather than expanding forever), and the
// coordinator validates its payloads at every depth.
func TestHandleJSONRecursiveType(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	cl := client.New(sys.NC)
	count := func(_ context.Context, _ int, n treeNode) (string, error) {
		var size func(treeNode) int
		size = func(n treeNode) int {
			s := 1
			for _, c := range n.Children {
				s += size(c)
			}
			return s
		}
		return fmt.Sprint(size(n)), nil
	}
	w, _ := sys.StartFunctionWorker(t, func(w *worker.Worker) error { return worker.HandleJSON(w, "TREE_SIZE", count) },
		worker.WithTasks(tasks.NewRegistry()))
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })

	ctx := context.Background()
	id, err := cl.Submit(ctx, "TREE_SIZE", json.RawMessage(`{"name":"a","children":[{"name":"b","children":[{"name":"c"}]},{"name":"d"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, "job completed", func() bool { return jobState(t, cl, id).State == protocol.StateCompleted })
	if j := jobState(t, cl, id); deref(j.Result) != "4" {
		t.Fatalf("job %+v, result %q, want 4", j, deref(j.Result))
	}
	_, err = cl.Submit(ctx, "TREE_SIZE", json.RawMessage(`{"name":"a","children":[{"name":"b","children":[{"name":""}]}]}`))
	if want := "Invalid payload: at '/children/0/children/0/name': minLength: got 0, want 1"; err == nil || err.Error() != want {
		t.Fatalf("a nested bad payload: %v, want %q", err, want)
	}
}

// TestTimeoutOption: Timeout(0), like MaxAttempts(0) and Concurrency(0), is the
// coordinator's default; it was a 1 ms deadline, which timed out every attempt.
func TestTimeoutOption(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{0, 0},
		{-time.Second, 0},
		{time.Microsecond, 1},
		{1500 * time.Millisecond, 1500},
	} {
		var decl protocol.TaskTypeDecl
		worker.Timeout(tc.d)(&decl)
		if decl.Options.TimeoutMillis != tc.want {
			t.Errorf("Timeout(%v): timeoutMillis %d, want %d", tc.d, decl.Options.TimeoutMillis, tc.want)
		}
	}
}

// sizedArgs holds Go integers that JSON numbers can overflow.
type sizedArgs struct {
	Level int8   `json:"level"`
	Port  uint16 `json:"port"`
	Count int    `json:"count"`
	Times uint8  `json:"times,omitempty" jsonschema:"minimum=1"`
}

// TestHandleJSONIntegers: a whole number written 2.0 or 1e3, which JSON Schema's
// integer takes and so the coordinator accepts, runs (encoding/json refused it, and the
// job failed at run time); a number its field cannot hold is refused at submission.
func TestHandleJSONIntegers(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	cl := client.New(sys.NC)
	sum := func(_ context.Context, _ int, a sizedArgs) (string, error) {
		return fmt.Sprint(int(a.Level) + int(a.Port) + a.Count + int(a.Times)), nil
	}
	w, _ := sys.StartFunctionWorker(t, func(w *worker.Worker) error { return worker.HandleJSON(w, "SUM", sum) },
		worker.WithTasks(tasks.NewRegistry()))
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	ctx := context.Background()
	id, err := cl.Submit(ctx, "SUM", json.RawMessage(`{"level":-2.0,"port":1e3,"count":2.50e1,"times":1.0}`))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, "job ended", func() bool { return jobState(t, cl, id).State.Terminal() })
	if j := jobState(t, cl, id); j.State != protocol.StateCompleted || deref(j.Result) != "1024" {
		t.Fatalf("job %+v (result %q, error %q), want COMPLETED with 1024", j, deref(j.Result), deref(j.Error))
	}
	for _, tc := range []struct{ payload, want string }{
		{`{"level":128,"port":1,"count":1}`, "Invalid payload: at '/level': maximum: got 128, want 127"},
		{`{"level":1,"port":-1,"count":1}`, "Invalid payload: at '/port': minimum: got -1, want 0"},
		{`{"level":1,"port":1,"count":1,"times":0}`, "Invalid payload: at '/times': minimum: got 0, want 1"},
		{`{"level":1,"port":1,"count":1.5}`, "Invalid payload: at '/count': got number, want integer"},
	} {
		if _, err := cl.Submit(ctx, "SUM", json.RawMessage(tc.payload)); err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", tc.payload, err, tc.want)
		}
	}
}
