package coordinator_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/worker"
)

func TestMain(m *testing.M) {
	buildBinary()
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { removeBinary() }))
}

// fastConfig is the reference defaults scaled to milliseconds.
func fastConfig() coordinator.Config {
	cfg := coordinator.DefaultConfig()
	cfg.HeartbeatTimeout = 400 * time.Millisecond
	cfg.SweepInterval = 10 * time.Millisecond
	cfg.TaskTimeout = 10 * time.Second
	cfg.RetryBaseDelay = 10 * time.Millisecond
	cfg.RetryMaxDelay = 40 * time.Millisecond
	cfg.Writers = 8
	return cfg
}

// system is an embedded NATS server, a coordinator and a client: the thing under test.
type system struct {
	t      testing.TB
	srv    *embeddednats.Server
	nc     *nats.Conn
	cfg    coordinator.Config
	coord  *coordinator.Coordinator
	client *client.Client
}

func setup(t *testing.T, mods ...func(*coordinator.Config)) *system {
	t.Helper()
	return setupTB(t, mods...)
}

func setupTB(t testing.TB, mods ...func(*coordinator.Config)) *system {
	t.Helper()
	srv, err := embeddednats.Start(context.Background(), embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := fastConfig()
	for _, m := range mods {
		m(&cfg)
	}
	s := &system{t: t, srv: srv, nc: nc, cfg: cfg, client: client.New(nc)}
	s.startCoordinator()
	return s
}

func (s *system) startCoordinator() {
	s.t.Helper()
	c, err := coordinator.New(s.nc, s.cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		s.t.Fatal(err)
	}
	s.coord = c
	s.t.Cleanup(func() { _ = c.Close() })
}

// restart stops the coordinator and starts a new one on the same store.
func (s *system) restart(mods ...func(*coordinator.Config)) {
	s.t.Helper()
	_ = s.coord.Close()
	for _, m := range mods {
		m(&s.cfg)
	}
	s.startCoordinator()
}

// startWorker runs a native worker until the test ends or stop is called.
func (s *system) startWorker(opts ...worker.Option) (w *worker.Worker, stop func()) {
	s.t.Helper()
	nc, err := s.srv.Connect()
	if err != nil {
		s.t.Fatal(err)
	}
	opts = append([]worker.Option{worker.WithHeartbeat(50 * time.Millisecond)}, opts...)
	w, err = worker.New(nc, opts...)
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	stop = func() {
		cancel()
		<-done
		_ = w.Close()
		nc.Close()
	}
	s.t.Cleanup(stop)
	s.eventually("worker "+w.ID()+" registered", func() bool { return s.hasWorker(w.ID()) })
	return w, stop
}

func (s *system) hasWorker(id string) bool {
	ws, err := s.client.Workers(context.Background())
	if err != nil {
		return false
	}
	for _, w := range ws {
		if w.WorkerID == id {
			return true
		}
	}
	return false
}

func (s *system) submit(taskType string, payload any, opts ...client.SubmitOption) string {
	s.t.Helper()
	id, err := s.client.Submit(context.Background(), taskType, payload, opts...)
	if err != nil {
		s.t.Fatalf("submit %s: %v", taskType, err)
	}
	return id
}

func (s *system) status(id string) protocol.Job {
	s.t.Helper()
	j, err := s.client.Status(context.Background(), id)
	if err != nil {
		s.t.Fatalf("status %s: %v", id, err)
	}
	return j
}

// wait waits for a job to end.
func (s *system) wait(id string) protocol.Job {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	j, err := s.client.Wait(ctx, id)
	if err != nil {
		s.t.Fatalf("wait %s: %v", id, err)
	}
	return j
}

// waitState waits until a job is in state.
func (s *system) waitState(id string, state protocol.State) protocol.Job {
	s.t.Helper()
	var j protocol.Job
	s.eventually("job "+id+" "+string(state), func() bool {
		j = s.status(id)
		return j.State == state
	})
	return j
}

// eventually polls cond until it holds or 15 s pass.
func (s *system) eventually(what string, cond func() bool) {
	s.t.Helper()
	eventually(s.t, 15*time.Second, what, cond)
}

func eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for delay := time.Millisecond; ; delay = min(delay*2, 50*time.Millisecond) {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(delay)
	}
}

// manualWorker is a real worker on the bus whose every move the test makes: it
// registers, heartbeats and reports results only when told to.
type manualWorker struct {
	s       *system
	id      string
	node    *bus.Node
	assigns chan protocol.TaskAssign
	cancels chan protocol.TaskCancel
}

var coordinatorAddr = bus.Address{Role: bus.RoleCoordinator}

func (s *system) manualWorker(id string, capacity int) *manualWorker {
	s.t.Helper()
	node, err := bus.New(s.nc, bus.Address{Role: bus.RoleWorker, ID: id})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = node.Close() })
	m := &manualWorker{s: s, id: id, node: node, assigns: make(chan protocol.TaskAssign, 100), cancels: make(chan protocol.TaskCancel, 100)}
	must(s.t, bus.Handle(node, protocol.PathAssign, func(_ context.Context, _ bus.Address, a protocol.TaskAssign) (struct{}, error) {
		m.assigns <- a
		return struct{}{}, nil
	}))
	must(s.t, bus.Handle(node, protocol.PathCancel, func(_ context.Context, _ bus.Address, c protocol.TaskCancel) (struct{}, error) {
		m.cancels <- c
		return struct{}{}, nil
	}))
	m.register(capacity)
	return m
}

func (m *manualWorker) register(capacity int) {
	m.s.t.Helper()
	_, err := bus.Ask[protocol.WorkerRegistered](context.Background(), m.node, coordinatorAddr, protocol.PathRegister,
		&protocol.WorkerRegister{WorkerID: m.id, Capacity: capacity})
	must(m.s.t, err)
}

func (m *manualWorker) heartbeat() error {
	_, err := bus.Ask[protocol.Heartbeat](context.Background(), m.node, coordinatorAddr, protocol.PathHeartbeat, &protocol.Heartbeat{WorkerID: m.id})
	return err
}

func (m *manualWorker) disconnect(cause string) {
	must(m.s.t, m.node.Tell(context.Background(), coordinatorAddr, protocol.PathDisconnect, &protocol.Disconnect{WorkerID: m.id, Cause: cause}))
}

// nextAssign waits for the next assignment.
func (m *manualWorker) nextAssign() protocol.TaskAssign {
	m.s.t.Helper()
	select {
	case a := <-m.assigns:
		return a
	case <-time.After(10 * time.Second):
		m.s.t.Fatalf("worker %s got no assignment", m.id)
	}
	return protocol.TaskAssign{}
}

func (m *manualWorker) nextCancel() protocol.TaskCancel {
	m.s.t.Helper()
	select {
	case c := <-m.cancels:
		return c
	case <-time.After(10 * time.Second):
		m.s.t.Fatalf("worker %s got no cancel", m.id)
	}
	return protocol.TaskCancel{}
}

// report sends a TASK_RESULT for a and returns the coordinator's acknowledgement.
func (m *manualWorker) report(a protocol.TaskAssign, success bool, text string) protocol.ResultAck {
	m.s.t.Helper()
	res := &protocol.TaskResult{WorkerID: m.id, JobID: a.JobID, AttemptID: a.AttemptID, Success: success}
	if success {
		res.Result = &text
	} else {
		res.Error = &text
	}
	ack, err := bus.Ask[protocol.ResultAck](context.Background(), m.node, coordinatorAddr, protocol.PathResult, res)
	must(m.s.t, err)
	return ack
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func text(s string) map[string]any { return map[string]any{"text": s} }

func rawJSON(s string) json.RawMessage { return json.RawMessage(s) }

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
