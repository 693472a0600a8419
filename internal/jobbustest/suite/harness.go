package suite

import (
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/backoff"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/internal/workerproto"
	"github.com/jobbus/jobbus/worker"
)

// System is an in-process jobbus system and a client of the transport under test.
type System struct {
	*jobbustest.System
	t testing.TB
	// Client is the transport's client.
	Client *client.Client
	tr     Transport
	// Bridge is the system's bridge, for a transport with Features.Bridged.
	Bridge interface {
		WorkerAddr() net.Addr
		ClientAddr() net.Addr
	}
}

// Setup starts a system for tr, the coordinator's configuration changed by mods, and
// stops it when the test ends. The configuration starts as jobbustest's fast one,
// whose heartbeat timeout is a minute: a test that loses a worker to its silence sets
// a short timeout itself, or moves the coordinator's clock past it.
func Setup(t testing.TB, tr Transport, mods ...func(*coordinator.Config)) *System {
	t.Helper()
	return setupBridged(t, tr, nil, mods...)
}

// setupBridged is Setup with the bridge's configuration, for a transport with
// Features.Bridged, changed by bridgeMods.
func setupBridged(t testing.TB, tr Transport, bridgeMods []func(*bridge.Config), mods ...func(*coordinator.Config)) *System {
	t.Helper()
	s := &System{System: jobbustest.Start(t, jobbustest.WithCoordinatorConfig(mods...)), t: t, tr: tr}
	if tr.Features.Bridged {
		s.Bridge = s.StartBridge(t, bridgeMods...)
	}
	s.Client = tr.Client(s)
	return s
}

// T is the test the system belongs to, for helpers of a package's own tests.
func (s *System) T() testing.TB { return s.t }

// Runner is a real worker (native or spec TCP) running the built-in tasks.
type Runner interface {
	ID() string
	Running() int
}

// StartWorker runs a real worker of the system's transport until the test ends or stop
// is called.
func (s *System) StartWorker(capacity int) (w Runner, stop func()) {
	s.t.Helper()
	w, stopRun := s.tr.Worker(s, capacity)
	stop = sync.OnceFunc(func() {
		stopRun()
		s.Eventually("worker "+w.ID()+" gone", func() bool { return !s.HasWorker(w.ID()) })
	})
	s.t.Cleanup(stop)
	s.Eventually("worker "+w.ID()+" registered", func() bool { return s.HasWorker(w.ID()) })
	return w, stop
}

// nativeWorker runs a native NATS worker.
func nativeWorker(s *System, capacity int) (Runner, func()) {
	return s.StartNativeWorker(s.t, worker.WithCapacity(capacity))
}

func natsClient(s *System) *client.Client { return client.New(s.NC) }

// HasWorker reports whether the coordinator lists worker id as live.
func (s *System) HasWorker(id string) bool { return jobbustest.WorkerListed(s.Client, id) }

// Submit submits a job, failing the test on an error.
func (s *System) Submit(taskType string, payload any, opts ...client.SubmitOption) string {
	s.t.Helper()
	id, err := s.Client.Submit(context.Background(), taskType, payload, opts...)
	if err != nil {
		s.t.Fatalf("submit %s: %v", taskType, err)
	}
	return id
}

// Status returns a job's snapshot, failing the test on an error.
func (s *System) Status(id string) protocol.Job {
	s.t.Helper()
	j, err := s.Client.Status(context.Background(), id)
	if err != nil {
		s.t.Fatalf("status %s: %v", id, err)
	}
	return j
}

// Wait waits for a job to end.
func (s *System) Wait(id string) protocol.Job {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	j, err := s.Client.Wait(ctx, id)
	if err != nil {
		s.t.Fatalf("wait %s: %v", id, err)
	}
	return j
}

// WaitState waits until a job is in state.
func (s *System) WaitState(id string, state protocol.State) protocol.Job {
	s.t.Helper()
	var j protocol.Job
	s.Eventually("job "+id+" "+string(state), func() bool {
		j = s.Status(id)
		return j.State == state
	})
	return j
}

// Eventually polls cond until it holds or 15 s pass.
func (s *System) Eventually(what string, cond func() bool) {
	s.t.Helper()
	testkit.Eventually(s.t, 15*time.Second, what, cond)
}

// Peer is a real worker whose every move the test makes: it registers, heartbeats and
// reports results only when told to. A bus peer speaks the bus, a TCP peer the worker
// port.
type Peer interface {
	ID() string
	Register(capacity int)
	// RegisterServing registers as a worker of the given task types (the taskTypes
	// extension of WORKER_REGISTER), declaring those given as declarations.
	RegisterServing(capacity int, types ...protocol.TaskTypeDecl)
	Heartbeat() error
	Disconnect()
	Assignments() <-chan protocol.TaskAssign
	Cancellations() <-chan protocol.TaskCancel
	// Report sends a TASK_RESULT; the acknowledgement is nil where the transport has
	// none (Features.ResultAcks).
	Report(a protocol.TaskAssign, success bool, text string) *protocol.ResultAck
}

// ManualWorker registers a test-driven worker of the system's transport, which
// heartbeats on its own until the test ends, so that only what the test does to it
// can make it lost.
func (s *System) ManualWorker(id string, capacity int) Peer {
	s.t.Helper()
	p := s.SilentWorker(id, capacity)
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
				_ = p.Heartbeat() // errors are the test's business (a worker it lost)
			}
		}
	}()
	s.t.Cleanup(func() { close(stop); <-done })
	return p
}

// SilentWorker registers a test-driven worker that never heartbeats by itself.
func (s *System) SilentWorker(id string, capacity int) Peer {
	s.t.Helper()
	p := s.tr.Peer(s, id)
	p.Register(capacity)
	return p
}

// NextAssign waits for p's next assignment.
func (s *System) NextAssign(p Peer) protocol.TaskAssign {
	s.t.Helper()
	select {
	case a := <-p.Assignments():
		return a
	case <-time.After(10 * time.Second):
		s.t.Fatalf("worker %s got no assignment", p.ID())
	}
	return protocol.TaskAssign{}
}

// NextCancel waits for p's next TASK_CANCEL.
func (s *System) NextCancel(p Peer) protocol.TaskCancel {
	s.t.Helper()
	select {
	case c := <-p.Cancellations():
		return c
	case <-time.After(10 * time.Second):
		s.t.Fatalf("worker %s got no cancel", p.ID())
	}
	return protocol.TaskCancel{}
}

// report reports through p, checking that the acknowledgement is what the transport
// declares.
func (s *System) report(p Peer, a protocol.TaskAssign, success bool, text string) *protocol.ResultAck {
	s.t.Helper()
	ack := p.Report(a, success, text)
	if (ack != nil) != s.tr.Features.ResultAcks {
		s.t.Fatalf("transport %s declares ResultAcks %v, but the result for job %s got ack %+v", s.tr.Name, s.tr.Features.ResultAcks, a.JobID, ack)
	}
	return ack
}

// Accept reports a result that must count, and waits until it has.
func (s *System) Accept(p Peer, a protocol.TaskAssign, success bool, text string) {
	s.t.Helper()
	if ack := s.report(p, a, success, text); ack != nil {
		if !ack.Accepted {
			s.t.Fatalf("result for job %s attempt %d refused", a.JobID, a.AttemptNumber)
		}
		return
	}
	s.Eventually("result for job "+a.JobID+" counted", func() bool {
		j := s.Status(a.JobID)
		return j.State != protocol.StateRunning || j.Attempts > a.AttemptNumber
	})
}

// Reject reports a result that must be stale, and checks it changed nothing.
func (s *System) Reject(p Peer, a protocol.TaskAssign, success bool, text string) {
	s.t.Helper()
	before := s.Status(a.JobID)
	if ack := s.report(p, a, success, text); ack != nil {
		if ack.Accepted {
			s.t.Fatalf("stale result for job %s attempt %d accepted", a.JobID, a.AttemptNumber)
		}
		return
	}
	// Without an acknowledgement, give the result time to arrive and do harm.
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if after := s.Status(a.JobID); after.State != before.State || Deref(after.Result) != Deref(before.Result) || Deref(after.Error) != Deref(before.Error) {
			s.t.Fatalf("stale result changed job %s: %+v -> %+v", a.JobID, before, after)
		}
	}
}

// BusPeer is a test-driven worker on the bus.
type BusPeer struct {
	s       *System
	id      string
	node    *bus.Node
	assigns chan protocol.TaskAssign
	cancels chan protocol.TaskCancel
}

var coordinatorAddr = bus.Address{Role: bus.RoleCoordinator}

func newBusPeer(s *System, id string) Peer {
	s.t.Helper()
	node, err := bus.New(s.NC, bus.Address{Role: bus.RoleWorker, ID: id}, bus.WithLogger(nil))
	Must(s.t, err)
	s.t.Cleanup(func() { _ = node.Close() })
	m := &BusPeer{s: s, id: id, node: node, assigns: make(chan protocol.TaskAssign, 100), cancels: make(chan protocol.TaskCancel, 100)}
	Must(s.t, bus.Handle(node, protocol.PathAssign, func(_ context.Context, _ bus.Address, a protocol.TaskAssign) (struct{}, error) {
		m.assigns <- a
		return struct{}{}, nil
	}))
	Must(s.t, bus.Handle(node, protocol.PathCancel, func(_ context.Context, _ bus.Address, c protocol.TaskCancel) (struct{}, error) {
		m.cancels <- c
		return struct{}{}, nil
	}))
	return m
}

// Node is the peer's bus node, for a test that speaks to the coordinator itself.
func (m *BusPeer) Node() *bus.Node { return m.node }

func (m *BusPeer) ID() string                                { return m.id }
func (m *BusPeer) Assignments() <-chan protocol.TaskAssign   { return m.assigns }
func (m *BusPeer) Cancellations() <-chan protocol.TaskCancel { return m.cancels }

func (m *BusPeer) Register(capacity int) {
	m.s.t.Helper()
	m.register(&protocol.WorkerRegister{WorkerID: m.id, Capacity: capacity})
}

func (m *BusPeer) RegisterServing(capacity int, types ...protocol.TaskTypeDecl) {
	m.s.t.Helper()
	m.register(&protocol.WorkerRegister{WorkerID: m.id, Capacity: capacity, TaskTypes: append([]protocol.TaskTypeDecl{}, types...)})
}

func (m *BusPeer) register(reg *protocol.WorkerRegister) {
	m.s.t.Helper()
	_, err := bus.Ask[protocol.WorkerRegistered](context.Background(), m.node, coordinatorAddr, protocol.PathRegister, reg)
	Must(m.s.t, err)
}

func (m *BusPeer) Heartbeat() error {
	_, err := bus.Ask[protocol.Heartbeat](context.Background(), m.node, coordinatorAddr, protocol.PathHeartbeat, &protocol.Heartbeat{WorkerID: m.id})
	return err
}

func (m *BusPeer) Disconnect() {
	Must(m.s.t, m.node.Tell(context.Background(), coordinatorAddr, protocol.PathDisconnect, &protocol.Disconnect{WorkerID: m.id, Cause: "connection closed"}))
}

// Report delivers a result as a worker does: offered until it is answered finally (a
// result whose job changed in memory only is answered 503 until that is stored).
func (m *BusPeer) Report(a protocol.TaskAssign, success bool, text string) *protocol.ResultAck {
	m.s.t.Helper()
	data, err := protocol.Encode(Result(m.id, a, success, text))
	Must(m.s.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, _, err := workerproto.Deliver(ctx, m.node, data, time.Time{}, backoff.Policy{Base: time.Millisecond, Max: 50 * time.Millisecond})
	Must(m.s.t, err)
	return &ack
}

// Result is worker workerID's TASK_RESULT for assignment a: text is the result on
// success, the error otherwise.
func Result(workerID string, a protocol.TaskAssign, success bool, text string) *protocol.TaskResult {
	res := &protocol.TaskResult{WorkerID: workerID, JobID: a.JobID, AttemptID: a.AttemptID, Success: success}
	if success {
		res.Result = &text
	} else {
		res.Error = &text
	}
	return res
}

// Must fails the test on err.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Text is the payload of a task that takes a text (SHA256, WORD_COUNT).
func Text(s string) map[string]any { return map[string]any{"text": s} }

// RawJSON is s as a raw payload.
func RawJSON(s string) json.RawMessage { return json.RawMessage(s) }

// Deref is *s, or "<nil>" for a nil s, for messages.
func Deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
