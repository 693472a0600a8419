package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tasks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher()) }

const (
	heartbeat = 20 * time.Millisecond
	sleep30s  = `{"durationMillis":30000}`
	// Text of the worker's cancellation causes, as reported in results.
	cancelledText = "attempt cancelled by the coordinator"
	abandonedText = "attempt abandoned: the worker registered again and the coordinator did not keep it"
)

// fakeCoordinator plays the coordinator's side of the worker protocol and records
// what it receives.
type fakeCoordinator struct {
	node *bus.Node

	mu            sync.Mutex
	registrations []protocol.WorkerRegister
	beats         []time.Time
	beatIDs       []string
	helds         []*protocol.Held      // what each heartbeat reported
	results       []protocol.TaskResult // acknowledged ones
	resultAsks    int
	disconnects   []protocol.Disconnect
	dropResults   int  // result asks left unanswered
	forgotten     bool // answer heartbeats with an error until the worker registers again
	registeredAt  []time.Time
	// claimBatches: registrations answer that the coordinator takes batches of results
	// (WorkerRegistered.Results), though it serves single results only: a newer leader
	// said so, and an older one leads now.
	claimBatches bool
}

func startCoordinator(t *testing.T, url string) *fakeCoordinator {
	t.Helper()
	n, err := bus.Connect(context.Background(), url, bus.Address{Role: bus.RoleCoordinator, ID: "fake"},
		bus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("coordinator connect: %v", err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return &fakeCoordinator{node: n}
}

// serve handles the four worker paths, role-wide as the real coordinator does.
func (c *fakeCoordinator) serve(t *testing.T) {
	t.Helper()
	must(t, bus.Handle(c.node, protocol.PathRegister, c.onRegister, bus.OnlyRole()))
	must(t, bus.Handle(c.node, protocol.PathHeartbeat, c.onHeartbeat, bus.OnlyRole()))
	must(t, bus.Handle(c.node, protocol.PathDisconnect, c.onDisconnect, bus.OnlyRole()))
	must(t, bus.Handle(c.node, protocol.PathResult, c.onResult, bus.OnlyRole()))
	must(t, c.node.Conn().Flush())
}

func (c *fakeCoordinator) onRegister(_ context.Context, _ bus.Address, r protocol.WorkerRegister) (protocol.WorkerRegistered, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgotten = false
	c.registrations = append(c.registrations, r)
	c.registeredAt = append(c.registeredAt, time.Now())
	ans := protocol.WorkerRegistered{WorkerID: r.WorkerID}
	if c.claimBatches {
		ans.Results = protocol.MaxResults
	}
	return ans, nil
}

func (c *fakeCoordinator) onHeartbeat(_ context.Context, _ bus.Address, hb protocol.Heartbeat) (protocol.Heartbeat, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.forgotten {
		return hb, bus.Errorf(bus.CodeNotFound, "unknown worker %s: register again", hb.WorkerID)
	}
	c.beats = append(c.beats, time.Now())
	c.beatIDs = append(c.beatIDs, hb.WorkerID)
	c.helds = append(c.helds, hb.Held)
	return hb, nil
}

func (c *fakeCoordinator) onDisconnect(_ context.Context, _ bus.Address, d protocol.Disconnect) (struct{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.disconnects = append(c.disconnects, d)
	return struct{}{}, nil
}

// onResult acknowledges a result, except that the first dropResults asks get no
// answer: their handler holds on until the node closes, so the worker's ask times out.
func (c *fakeCoordinator) onResult(ctx context.Context, _ bus.Address, r protocol.TaskResult) (protocol.ResultAck, error) {
	c.mu.Lock()
	c.resultAsks++
	drop := c.resultAsks <= c.dropResults
	if !drop {
		c.results = append(c.results, r)
	}
	c.mu.Unlock()
	if drop {
		<-ctx.Done()
		return protocol.ResultAck{}, ctx.Err()
	}
	return protocol.ResultAck{JobID: r.JobID, Accepted: true}, nil
}

func (c *fakeCoordinator) assign(t *testing.T, workerID, job, attemptID, taskType, payload string) {
	t.Helper()
	must(t, c.node.Tell(context.Background(), bus.Address{Role: bus.RoleWorker, ID: workerID}, protocol.PathAssign,
		&protocol.TaskAssign{JobID: job, AttemptID: attemptID, AttemptNumber: 1, TaskType: taskType, Payload: json.RawMessage(payload)}))
}

func (c *fakeCoordinator) assignNumber(t *testing.T, workerID, job, attemptID string, number int, taskType, payload string) {
	t.Helper()
	must(t, c.node.Tell(context.Background(), bus.Address{Role: bus.RoleWorker, ID: workerID}, protocol.PathAssign,
		&protocol.TaskAssign{JobID: job, AttemptID: attemptID, AttemptNumber: number, TaskType: taskType, Payload: json.RawMessage(payload)}))
}

func (c *fakeCoordinator) cancel(t *testing.T, workerID, job, attemptID string) {
	t.Helper()
	must(t, c.node.Tell(context.Background(), bus.Address{Role: bus.RoleWorker, ID: workerID}, protocol.PathCancel,
		&protocol.TaskCancel{JobID: job, AttemptID: attemptID}))
}

func (c *fakeCoordinator) registered() []protocol.WorkerRegister {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.registrations)
}

func (c *fakeCoordinator) beatCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.beats)
}

// resultsFor returns the acknowledged results of a lease.
func (c *fakeCoordinator) resultsFor(job, attemptID string) []protocol.TaskResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []protocol.TaskResult
	for _, r := range c.results {
		if r.JobID == job && r.AttemptID == attemptID {
			out = append(out, r)
		}
	}
	return out
}

// result waits for the one acknowledged result of a lease.
func (c *fakeCoordinator) result(t *testing.T, job, attemptID string) protocol.TaskResult {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, "result of "+job+"/"+attemptID, func() bool { return len(c.resultsFor(job, attemptID)) > 0 })
	return c.resultsFor(job, attemptID)[0]
}

// logs records the worker's log messages.
type logs struct {
	mu      sync.Mutex
	records []string // "message key=value ..."
}

func (l *logs) handler() slog.Handler { return &logHandler{logs: l} }

// has reports whether a record contains every part.
func (l *logs) has(parts ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.records {
		if containsAll(r, parts) {
			return true
		}
	}
	return false
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

type logHandler struct {
	logs  *logs
	attrs []slog.Attr
}

func (h *logHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	write := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	}
	for _, a := range h.attrs {
		write(a)
	}
	r.Attrs(write)
	h.logs.mu.Lock()
	h.logs.records = append(h.logs.records, b.String())
	h.logs.mu.Unlock()
	return nil
}

func (h *logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &logHandler{logs: h.logs, attrs: append(slices.Clone(h.attrs), as...)}
}

func (h *logHandler) WithGroup(string) slog.Handler { return h }

// fixture is a server, a fake coordinator and a running worker.
type fixture struct {
	srv   *embeddednats.Server
	coord *fakeCoordinator
	w     *worker.Worker
	nc    *nats.Conn // the worker's connection, when shared
	logs  *logs
	stop  context.CancelFunc
	done  chan error // Run's result
}

type setupConfig struct {
	noCoordinator bool // start the fake coordinator's handlers later (serve)
	dropResults   int
	claimBatches  bool // see fakeCoordinator.claimBatches
	shared        bool // build the worker with New on a connection of the test's
	opts          []worker.Option
	handle        func(*worker.Worker) error // task types of its own, before Run
}

func startServer(t *testing.T) *embeddednats.Server {
	t.Helper()
	srv, err := embeddednats.Start(context.Background(),
		embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()),
		embeddednats.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("start nats: %v", err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return srv
}

func setup(t *testing.T, sc setupConfig) *fixture {
	t.Helper()
	srv := startServer(t)
	f := &fixture{srv: srv, coord: startCoordinator(t, srv.ClientURL()), logs: &logs{}}
	f.coord.dropResults = sc.dropResults
	f.coord.claimBatches = sc.claimBatches
	if !sc.noCoordinator {
		f.coord.serve(t)
	}
	natsOpts := []nats.Option{nats.ReconnectWait(20 * time.Millisecond), nats.ReconnectJitter(0, 0), nats.MaxReconnects(-1)}
	opts := append([]worker.Option{
		worker.WithHeartbeat(heartbeat),
		worker.WithResultRetry(5*time.Millisecond, 50*time.Millisecond),
		worker.WithLogger(slog.New(f.logs.handler())),
		worker.WithBusOptions(bus.WithAskTimeout(250*time.Millisecond), bus.WithNATSOptions(natsOpts...)),
	}, sc.opts...)
	var err error
	if sc.shared {
		nc, cerr := nats.Connect(srv.ClientURL(), natsOpts...)
		if cerr != nil {
			t.Fatalf("dial: %v", cerr)
		}
		t.Cleanup(nc.Close)
		f.nc = nc
		f.w, err = worker.New(nc, opts...)
	} else {
		f.w, err = worker.Connect(context.Background(), srv.ClientURL(), opts...)
	}
	if err != nil {
		t.Fatalf("new worker: %v", err)
	}
	t.Cleanup(func() { must(t, f.w.Close()) })
	if sc.handle != nil {
		must(t, sc.handle(f.w))
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.stop, f.done = cancel, make(chan error, 1)
	go func() { f.done <- f.w.Run(ctx) }()
	t.Cleanup(func() { f.shutdown(t) })
	return f
}

// shutdown ends Run and checks it returned nil; it is idempotent.
func (f *fixture) shutdown(t *testing.T) {
	t.Helper()
	f.stop()
	select {
	case err, ok := <-f.done:
		if ok {
			close(f.done)
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// waitRegistered waits for the n-th registration.
func (f *fixture) waitRegistered(t *testing.T, n int) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("registration %d", n), func() bool { return len(f.coord.registered()) >= n })
}

func TestRegisters(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{opts: []worker.Option{worker.WithID("w-reg"), worker.WithCapacity(7)}})
	f.waitRegistered(t, 1)
	got := f.coord.registered()[0]
	want := protocol.WorkerRegister{WorkerID: "w-reg", Capacity: 7, TaskTypes: tasks.Builtins().Declarations()}
	if got.WorkerID != want.WorkerID || got.Capacity != want.Capacity ||
		!slices.Equal(protocol.Names(got.TaskTypes), tasks.Builtins().Names()) || !slices.EqualFunc(got.TaskTypes, want.TaskTypes,
		func(a, b protocol.TaskTypeDecl) bool { return a.Name == b.Name && !a.Declared && !b.Declared }) {
		t.Errorf("registration = %+v, want %+v", got, want)
	}
	if f.w.ID() != "w-reg" {
		t.Errorf("ID() = %q, want w-reg", f.w.ID())
	}
}

func TestRegistersOnceCoordinatorAnswers(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{noCoordinator: true})
	testkit.Eventually(t, 10*time.Second, "worker waiting for the coordinator", func() bool { return f.logs.has("waiting for the coordinator") })
	if n := len(f.coord.registered()); n != 0 {
		t.Fatalf("%d registrations before the coordinator served", n)
	}
	f.coord.serve(t)
	f.waitRegistered(t, 1)
	testkit.Eventually(t, 10*time.Second, "heartbeats", func() bool { return f.coord.beatCount() >= 2 })
}

// TestQuietWhileTheCoordinatorStarts: a coordinator that answers a moment after the
// worker starts (as under serve) is no news: the worker says it waits only after a
// second unanswered.
func TestQuietWhileTheCoordinatorStarts(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{noCoordinator: true})
	testkit.Eventually(t, 10*time.Second, "a second registration try", func() bool { return f.logs.has("worker registration not answered; retrying") })
	f.coord.serve(t)
	f.waitRegistered(t, 1)
	if f.logs.has("waiting for the coordinator") {
		t.Error("the worker said it was waiting for a coordinator that answered at once")
	}
}

func TestDefaultIDAndSharedConnection(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	w, err := worker.New(nc, worker.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^worker-[0-9a-f]{8}$`).MatchString(w.ID()) {
		t.Errorf("default ID %q, want worker-<8 hex>", w.ID())
	}
	must(t, w.Close())
	must(t, w.Close()) // idempotent
	if !nc.IsConnected() {
		t.Error("Close closed a connection the worker does not own")
	}
	if err := w.Run(context.Background()); err == nil {
		t.Error("Run after Close succeeded")
	}
}

func TestOptionsAreValidated(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		opt     worker.Option
		mention string
	}{
		{"CapacityZero", worker.WithCapacity(0), "capacity"},
		{"CapacityTooLarge", worker.WithCapacity(1025), "capacity"},
		{"HeartbeatZero", worker.WithHeartbeat(0), "heartbeat"},
		{"RetryBaseZero", worker.WithResultRetry(0, time.Second), "retry"},
		{"RetryMaxBelowBase", worker.WithResultRetry(time.Second, time.Millisecond), "retry"},
		{"ShutdownNegative", worker.WithShutdownTimeout(-1), "shutdown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := worker.New(nil, tt.opt)
			if err == nil || !strings.Contains(err.Error(), tt.mention) {
				t.Errorf("New = %v, want an error mentioning %q", err, tt.mention)
			}
		})
	}
}

func TestHeartbeats(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{opts: []worker.Option{worker.WithID("w-beat")}})
	const n = 6
	testkit.Eventually(t, 10*time.Second, "heartbeats", func() bool { return f.coord.beatCount() >= n })
	f.coord.mu.Lock()
	beats, ids, registered := slices.Clone(f.coord.beats), slices.Clone(f.coord.beatIDs), f.coord.registeredAt[0]
	f.coord.mu.Unlock()
	for _, id := range ids {
		if id != "w-beat" {
			t.Fatalf("heartbeat from %q, want w-beat", id)
		}
	}
	if beats[0].Before(registered) {
		t.Error("heartbeat before registration")
	}
	// A ticker never runs ahead of its schedule; half the interval leaves room for a
	// late first beat.
	if avg := beats[len(beats)-1].Sub(beats[0]) / time.Duration(len(beats)-1); avg < heartbeat/2 {
		t.Errorf("heartbeats every %v on average, configured %v", avg, heartbeat)
	}
}

func TestRunsAssignments(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{})
	f.waitRegistered(t, 1)
	tests := []struct {
		name     string
		taskType string
		number   int
		payload  string
		success  bool
		want     string // result or error
	}{
		{"SHA256", tasks.TypeSHA256, 1, `{"text":"abc"}`, true, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"WordCount", tasks.TypeWordCount, 1, `{"text":"the quick  brown\tfox"}`, true, "4"},
		{"FailBeforeItsAttempt", tasks.TypeFail, 1, `{"failUntilAttempt":3}`, false, "deliberate failure on attempt 1 (failing until 3)"},
		{"FailSucceedsOnItsAttempt", tasks.TypeFail, 3, `{"failUntilAttempt":3}`, true, "succeeded on attempt 3"},
		{"InvalidPayload", tasks.TypeSHA256, 1, `{"text":5}`, false, "Invalid payload: Field 'text' must be a string"},
		{"UnknownTaskType", "RESIZE_IMAGE", 1, `{}`, false, "unknown task type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			job, attemptID := "job-"+tt.name, "att-"+tt.name
			f.coord.assignNumber(t, f.w.ID(), job, attemptID, tt.number, tt.taskType, tt.payload)
			r := f.coord.result(t, job, attemptID)
			if r.WorkerID != f.w.ID() || r.Success != tt.success {
				t.Fatalf("result = %+v, want worker %s success %v", r, f.w.ID(), tt.success)
			}
			got := deref(r.Error)
			if tt.success {
				got = deref(r.Result)
				if r.Error != nil {
					t.Errorf("successful result carries error %q", *r.Error)
				}
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{opts: []worker.Option{worker.WithCapacity(8)}})
	f.waitRegistered(t, 1)
	id := f.w.ID()

	t.Run("MatchingLeaseEndsAttempt", func(t *testing.T) {
		f.coord.assign(t, id, "job-c1", "a1", tasks.TypeSleep, sleep30s)
		testkit.Eventually(t, 10*time.Second, "attempt running", func() bool { return f.logs.has("attempt started", "job=job-c1") })
		f.coord.cancel(t, id, "job-c1", "a1")
		// Well before the 30 s sleep would end.
		r := f.coord.result(t, "job-c1", "a1")
		if r.Success || deref(r.Error) != cancelledText {
			t.Errorf("cancelled attempt reported %+v (error %q), want failure %q", r, deref(r.Error), cancelledText)
		}
	})
	t.Run("WrongAttemptIgnored", func(t *testing.T) {
		f.coord.assign(t, id, "job-c2", "a2", tasks.TypeSleep, sleep30s)
		testkit.Eventually(t, 10*time.Second, "attempt running", func() bool { return f.logs.has("attempt started", "job=job-c2") })
		f.coord.cancel(t, id, "job-c2", "a-old")
		testkit.Eventually(t, 10*time.Second, "cancel ignored", func() bool { return f.logs.has("cancel ignored", "job=job-c2", "attempt=a-old") })
		if f.w.Running() != 1 || len(f.coord.resultsFor("job-c2", "a2")) != 0 {
			t.Errorf("a cancel with the wrong attempt id ended the attempt: running %d", f.w.Running())
		}
		f.coord.cancel(t, id, "job-c2", "a2")
		f.coord.result(t, "job-c2", "a2")
	})
	t.Run("SupersededAttemptSparesNewer", func(t *testing.T) {
		f.coord.assign(t, id, "job-c3", "old", tasks.TypeSleep, sleep30s)
		f.coord.assign(t, id, "job-c3", "new", tasks.TypeSleep, sleep30s)
		testkit.Eventually(t, 10*time.Second, "both attempts running", func() bool { return f.w.Running() == 2 })
		f.coord.cancel(t, id, "job-c3", "old")
		if r := f.coord.result(t, "job-c3", "old"); r.Success {
			t.Errorf("cancelled attempt succeeded: %+v", r)
		}
		if f.w.Running() != 1 || len(f.coord.resultsFor("job-c3", "new")) != 0 {
			t.Errorf("cancelling the old attempt touched the new one: running %d", f.w.Running())
		}
	})
}

func TestResultRetriedUntilAcknowledged(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{dropResults: 2})
	f.waitRegistered(t, 1)
	f.coord.assign(t, f.w.ID(), "job-r", "att-r", tasks.TypeSHA256, `{"text":"abc"}`)
	r := f.coord.result(t, "job-r", "att-r")
	if !r.Success || r.AttemptID != "att-r" {
		t.Errorf("result = %+v", r)
	}
	f.shutdown(t) // no goroutine left that could send it again
	f.coord.mu.Lock()
	asks := f.coord.resultAsks
	f.coord.mu.Unlock()
	if asks != 3 {
		t.Errorf("result asked %d times, want 3 (2 unanswered, 1 acknowledged)", asks)
	}
	if n := len(f.coord.resultsFor("job-r", "att-r")); n != 1 {
		t.Errorf("result acknowledged %d times, want once", n)
	}
}

func TestReregistersWhenForgotten(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{})
	f.waitRegistered(t, 1)
	f.coord.assign(t, f.w.ID(), "job-f", "att-f", tasks.TypeSleep, sleep30s)
	testkit.Eventually(t, 10*time.Second, "attempt running", func() bool { return f.w.Running() == 1 })
	f.coord.mu.Lock()
	f.coord.forgotten = true
	f.coord.mu.Unlock()
	f.waitRegistered(t, 2)
	// The registration reported what the worker holds.
	if h := f.coord.registered()[1].Held; h == nil || !slices.Contains(h.Attempts, protocol.HeldAttempt{AttemptRef: protocol.AttemptRef{JobID: "job-f", AttemptID: "att-f"}}) {
		t.Errorf("registering again reported %+v, want att-f held", h)
	}
	// The coordinator kept nothing: the new registration ended the old session's
	// leases, and the attempt is given up.
	if r := f.coord.result(t, "job-f", "att-f"); r.Success || deref(r.Error) != abandonedText {
		t.Errorf("attempt of the forgotten session reported %+v (error %q)", r, deref(r.Error))
	}
	beats := f.coord.beatCount()
	testkit.Eventually(t, 10*time.Second, "heartbeats after registering again", func() bool { return f.coord.beatCount() >= beats+2 })
	// New work runs under the new registration.
	f.coord.assign(t, f.w.ID(), "job-f2", "att-f2", tasks.TypeWordCount, `{"text":"a b"}`)
	if r := f.coord.result(t, "job-f2", "att-f2"); deref(r.Result) != "2" {
		t.Errorf("result after registering again = %+v", r)
	}
}

// TestHeartbeatsAfterReconnect: a connection that came back costs the worker's
// attempts nothing. It heartbeats, reporting what it holds, instead of registering
// again; the attempt that ran across the reconnect goes on and its result is
// delivered.
func TestHeartbeatsAfterReconnect(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{shared: true})
	f.waitRegistered(t, 1)
	f.coord.assign(t, f.w.ID(), "job-across", "att-across", tasks.TypeSleep, `{"durationMillis":400}`)
	testkit.Eventually(t, 10*time.Second, "attempt running", func() bool { return f.w.Running() == 1 })
	beats := f.coord.beatCount()
	cid, err := f.nc.GetClientID()
	must(t, err)
	must(t, f.srv.NATS().DisconnectClientByID(cid))
	across := protocol.HeldAttempt{AttemptRef: protocol.AttemptRef{JobID: "job-across", AttemptID: "att-across"}}
	testkit.Eventually(t, 10*time.Second, "a heartbeat after the reconnect reporting the attempt", func() bool {
		f.coord.mu.Lock()
		defer f.coord.mu.Unlock()
		for _, h := range f.coord.helds[min(beats, len(f.coord.helds)):] {
			if h != nil && slices.Contains(h.Attempts, across) {
				return true
			}
		}
		return false
	})
	if r := f.coord.result(t, "job-across", "att-across"); !r.Success || deref(r.Result) != "slept 400 ms" {
		t.Errorf("attempt across the reconnect reported %+v (error %q)", r, deref(r.Error))
	}
	if n := len(f.coord.registered()); n != 1 {
		t.Errorf("%d registrations, want 1: a reconnect needs none", n)
	}
	// The worker's subscriptions came back with the connection.
	f.coord.assign(t, f.w.ID(), "job-rc", "att-rc", tasks.TypeSHA256, `{"text":""}`)
	want := "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	if r := f.coord.result(t, "job-rc", "att-rc"); deref(r.Result) != want {
		t.Errorf("result after reconnect = %+v", r)
	}
}

func TestAssignmentsBeyondCapacityRun(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{opts: []worker.Option{worker.WithCapacity(1)}})
	f.waitRegistered(t, 1)
	f.coord.assign(t, f.w.ID(), "job-k1", "a", tasks.TypeSleep, sleep30s)
	f.coord.assign(t, f.w.ID(), "job-k2", "a", tasks.TypeSleep, sleep30s)
	testkit.Eventually(t, 10*time.Second, "both attempts running", func() bool { return f.w.Running() == 2 })
	if !f.logs.has("assignment beyond capacity") {
		t.Error("no warning for an assignment beyond capacity")
	}
}

func TestRunStopsAndSaysGoodbye(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{opts: []worker.Option{worker.WithID("w-bye")}})
	f.waitRegistered(t, 1)
	f.coord.assign(t, "w-bye", "job-s", "att-s", tasks.TypeSleep, sleep30s)
	testkit.Eventually(t, 10*time.Second, "attempt running", func() bool { return f.w.Running() == 1 })
	f.shutdown(t) // Run returns nil, well before the 30 s sleep ends
	if n := f.w.Running(); n != 0 {
		t.Errorf("%d attempts still running after Run returned", n)
	}
	testkit.Eventually(t, 10*time.Second, "goodbye", func() bool {
		f.coord.mu.Lock()
		defer f.coord.mu.Unlock()
		return len(f.coord.disconnects) > 0
	})
	f.coord.mu.Lock()
	bye := f.coord.disconnects[0]
	f.coord.mu.Unlock()
	if bye != (protocol.Disconnect{WorkerID: "w-bye", Cause: "worker shutting down"}) {
		t.Errorf("goodbye = %+v", bye)
	}
	// The goodbye stands for the attempt the shutdown cut short.
	if n := len(f.coord.resultsFor("job-s", "att-s")); n != 0 {
		t.Errorf("%d results for an attempt stopped by shutdown", n)
	}
	if err := f.w.Run(context.Background()); !errors.Is(err, worker.ErrStarted) {
		t.Errorf("second Run = %v, want ErrStarted", err)
	}
}

func TestShutdownBoundsUndeliveredResults(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{dropResults: 1 << 30, opts: []worker.Option{worker.WithShutdownTimeout(100 * time.Millisecond)}})
	f.waitRegistered(t, 1)
	f.coord.assign(t, f.w.ID(), "job-u", "att-u", tasks.TypeWordCount, `{"text":"x"}`)
	testkit.Eventually(t, 10*time.Second, "result retried", func() bool {
		f.coord.mu.Lock()
		defer f.coord.mu.Unlock()
		return f.coord.resultAsks >= 2
	})
	f.shutdown(t) // returns although the coordinator never answers
	if !f.logs.has("result not delivered", "job=job-u") {
		t.Error("undelivered result not logged")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestHandlerContext: a handler's context answers the attempt's values (its job's id,
// a reporting logger), through contexts derived from it too, and ends on a cancel with
// the coordinator's cause; outside a handler there is no attempt.
func TestHandlerContext(t *testing.T) {
	t.Parallel()
	type seen struct {
		jobID, derivedJobID string
		logs, errBefore     bool
		cause               string
	}
	got := make(chan seen, 1)
	f := setup(t, setupConfig{handle: func(w *worker.Worker) error {
		return w.Handle("CTX_PROBE", func(ctx context.Context, _ int, _ json.RawMessage) (string, error) {
			type other struct{}
			derived := context.WithValue(ctx, other{}, 1)
			s := seen{jobID: worker.JobID(ctx), derivedJobID: worker.JobID(derived),
				logs: worker.Logger(ctx).Enabled(ctx, slog.LevelInfo), errBefore: ctx.Err() != nil}
			<-ctx.Done()
			s.cause = context.Cause(ctx).Error()
			got <- s
			return "", ctx.Err()
		})
	}})
	f.waitRegistered(t, 1)
	f.coord.assign(t, f.w.ID(), "job-ctx", "a1", "CTX_PROBE", `{}`)
	testkit.Eventually(t, 10*time.Second, "attempt running", func() bool { return f.w.Running() == 1 })
	f.coord.cancel(t, f.w.ID(), "job-ctx", "a1")
	want := seen{jobID: "job-ctx", derivedJobID: "job-ctx", logs: true, cause: cancelledText}
	select {
	case s := <-got:
		if s != want {
			t.Errorf("handler saw %+v, want %+v", s, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("handler not cancelled")
	}
	if r := f.coord.result(t, "job-ctx", "a1"); r.Success || deref(r.Error) != cancelledText {
		t.Errorf("result %+v (error %q), want failure %q", r, deref(r.Error), cancelledText)
	}
	if id := worker.JobID(context.Background()); id != "" {
		t.Errorf("JobID outside a handler = %q", id)
	}
	if _, err := worker.ParentResults(context.Background()); !errors.Is(err, worker.ErrNoAttempt) {
		t.Errorf("ParentResults outside a handler: %v, want ErrNoAttempt", err)
	}
}
