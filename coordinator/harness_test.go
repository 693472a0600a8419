package coordinator_test

import (
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { removeBinary() }))
}

// system is an in-process jobbus system and a client of the transport under test.
type system struct {
	*jobbustest.System
	t      testing.TB
	client *client.Client
	tr     transport
	bridge interface {
		WorkerAddr() net.Addr
		ClientAddr() net.Addr
	}
}

func setup(t *testing.T, tr transport, mods ...func(*coordinator.Config)) *system {
	t.Helper()
	return setupTB(t, tr, mods...)
}

func setupTB(t testing.TB, tr transport, mods ...func(*coordinator.Config)) *system {
	t.Helper()
	s := &system{System: jobbustest.Start(t, jobbustest.WithCoordinatorConfig(mods...)), t: t, tr: tr}
	if tr.bridged {
		s.bridge = s.StartBridge(t)
	}
	s.client = tr.client(s)
	return s
}

// runner is a real worker (native or spec TCP) running the built-in tasks.
type runner interface {
	ID() string
	Running() int
}

// startWorker runs a real worker of the system's transport until the test ends or stop
// is called.
func (s *system) startWorker(capacity int) (w runner, stop func()) {
	s.t.Helper()
	w, stopRun := s.tr.worker(s, capacity)
	stop = sync.OnceFunc(func() {
		stopRun()
		s.eventually("worker "+w.ID()+" gone", func() bool { return !s.hasWorker(w.ID()) })
	})
	s.t.Cleanup(stop)
	s.eventually("worker "+w.ID()+" registered", func() bool { return s.hasWorker(w.ID()) })
	return w, stop
}

// nativeWorker runs a native NATS worker.
func nativeWorker(s *system, capacity int) (runner, func()) {
	return s.StartNativeWorker(s.t, worker.WithCapacity(capacity))
}

func (s *system) hasWorker(id string) bool { return jobbustest.WorkerListed(s.client, id) }

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
	testkit.Eventually(s.t, 15*time.Second, what, cond)
}

// peer is a real worker whose every move the test makes: it registers, heartbeats and
// reports results only when told to. busPeer speaks the bus, tcpPeer the worker port.
type peer interface {
	ID() string
	register(capacity int)
	heartbeat() error
	disconnect()
	assignments() <-chan protocol.TaskAssign
	cancellations() <-chan protocol.TaskCancel
	// report sends a TASK_RESULT; the acknowledgement is nil where the transport has none.
	report(a protocol.TaskAssign, success bool, text string) *protocol.ResultAck
}

// manualWorker registers a test-driven worker of the system's transport, which
// heartbeats on its own until the test ends, so that only what the test does to it
// can make it lost.
func (s *system) manualWorker(id string, capacity int) peer {
	s.t.Helper()
	p := s.silentWorker(id, capacity)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.Config.HeartbeatTimeout / 8)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = p.heartbeat() // errors are the test's business (a worker it lost)
			}
		}
	}()
	s.t.Cleanup(func() { close(stop); <-done })
	return p
}

// silentWorker registers a test-driven worker that never heartbeats by itself.
func (s *system) silentWorker(id string, capacity int) peer {
	s.t.Helper()
	p := s.tr.peer(s, id)
	p.register(capacity)
	return p
}

// nextAssign waits for p's next assignment.
func (s *system) nextAssign(p peer) protocol.TaskAssign {
	s.t.Helper()
	select {
	case a := <-p.assignments():
		return a
	case <-time.After(10 * time.Second):
		s.t.Fatalf("worker %s got no assignment", p.ID())
	}
	return protocol.TaskAssign{}
}

func (s *system) nextCancel(p peer) protocol.TaskCancel {
	s.t.Helper()
	select {
	case c := <-p.cancellations():
		return c
	case <-time.After(10 * time.Second):
		s.t.Fatalf("worker %s got no cancel", p.ID())
	}
	return protocol.TaskCancel{}
}

// accept reports a result that must count, and waits until it has.
func (s *system) accept(p peer, a protocol.TaskAssign, success bool, text string) {
	s.t.Helper()
	if ack := p.report(a, success, text); ack != nil {
		if !ack.Accepted {
			s.t.Fatalf("result for job %s attempt %d refused", a.JobID, a.AttemptNumber)
		}
		return
	}
	s.eventually("result for job "+a.JobID+" counted", func() bool {
		j := s.status(a.JobID)
		return j.State != protocol.StateRunning || j.Attempts > a.AttemptNumber
	})
}

// reject reports a result that must be stale, and checks it changed nothing.
func (s *system) reject(p peer, a protocol.TaskAssign, success bool, text string) {
	s.t.Helper()
	before := s.status(a.JobID)
	if ack := p.report(a, success, text); ack != nil {
		if ack.Accepted {
			s.t.Fatalf("stale result for job %s attempt %d accepted", a.JobID, a.AttemptNumber)
		}
		return
	}
	// Without an acknowledgement, give the result time to arrive and do harm.
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if after := s.status(a.JobID); after.State != before.State || deref(after.Result) != deref(before.Result) || deref(after.Error) != deref(before.Error) {
			s.t.Fatalf("stale result changed job %s: %+v -> %+v", a.JobID, before, after)
		}
	}
}

// busPeer is a test-driven worker on the bus.
type busPeer struct {
	s       *system
	id      string
	node    *bus.Node
	assigns chan protocol.TaskAssign
	cancels chan protocol.TaskCancel
}

var coordinatorAddr = bus.Address{Role: bus.RoleCoordinator}

func newBusPeer(s *system, id string) peer {
	s.t.Helper()
	node, err := bus.New(s.NC, bus.Address{Role: bus.RoleWorker, ID: id}, bus.WithLogger(nil))
	must(s.t, err)
	s.t.Cleanup(func() { _ = node.Close() })
	m := &busPeer{s: s, id: id, node: node, assigns: make(chan protocol.TaskAssign, 100), cancels: make(chan protocol.TaskCancel, 100)}
	must(s.t, bus.Handle(node, protocol.PathAssign, func(_ context.Context, _ bus.Address, a protocol.TaskAssign) (struct{}, error) {
		m.assigns <- a
		return struct{}{}, nil
	}))
	must(s.t, bus.Handle(node, protocol.PathCancel, func(_ context.Context, _ bus.Address, c protocol.TaskCancel) (struct{}, error) {
		m.cancels <- c
		return struct{}{}, nil
	}))
	return m
}

func (m *busPeer) ID() string                                { return m.id }
func (m *busPeer) assignments() <-chan protocol.TaskAssign   { return m.assigns }
func (m *busPeer) cancellations() <-chan protocol.TaskCancel { return m.cancels }

func (m *busPeer) register(capacity int) {
	m.s.t.Helper()
	_, err := bus.Ask[protocol.WorkerRegistered](context.Background(), m.node, coordinatorAddr, protocol.PathRegister,
		&protocol.WorkerRegister{WorkerID: m.id, Capacity: capacity})
	must(m.s.t, err)
}

func (m *busPeer) heartbeat() error {
	_, err := bus.Ask[protocol.Heartbeat](context.Background(), m.node, coordinatorAddr, protocol.PathHeartbeat, &protocol.Heartbeat{WorkerID: m.id})
	return err
}

func (m *busPeer) disconnect() {
	must(m.s.t, m.node.Tell(context.Background(), coordinatorAddr, protocol.PathDisconnect, &protocol.Disconnect{WorkerID: m.id, Cause: "connection closed"}))
}

func (m *busPeer) report(a protocol.TaskAssign, success bool, text string) *protocol.ResultAck {
	m.s.t.Helper()
	ack, err := bus.Ask[protocol.ResultAck](context.Background(), m.node, coordinatorAddr, protocol.PathResult, result(m.id, a, success, text))
	must(m.s.t, err)
	return &ack
}

func result(workerID string, a protocol.TaskAssign, success bool, text string) *protocol.TaskResult {
	res := &protocol.TaskResult{WorkerID: workerID, JobID: a.JobID, AttemptID: a.AttemptID, Success: success}
	if success {
		res.Result = &text
	} else {
		res.Error = &text
	}
	return res
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
