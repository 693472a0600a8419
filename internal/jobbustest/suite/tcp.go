package suite

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit/specpeer"
	"github.com/jobbus/jobbus/worker/tcpworker"
)

// The TCP transports: the bridge's ports, alone and mixed with native peers.

func tcpClient(s *System) *client.Client {
	c, err := client.DialTCP(context.Background(), s.Bridge.ClientAddr().String())
	Must(s.t, err)
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

func tcpWorker(s *System, capacity int) (Runner, func()) {
	w, err := tcpworker.New(s.Bridge.WorkerAddr().String(), tcpworker.WithCapacity(capacity),
		tcpworker.WithHeartbeat(50*time.Millisecond), tcpworker.WithReconnectDelay(20*time.Millisecond), tcpworker.WithLogger(nil))
	Must(s.t, err)
	return w, jobbustest.Go(s.t, w.Run)
}

// tcpPeer is a test-driven spec worker on the bridge's worker port, writing and reading
// frames byte for byte as PROTOCOL.md says (a specpeer.Peer per registration).
type tcpPeer struct {
	s       *System
	id      string
	mu      sync.Mutex
	conn    *specpeer.Peer
	assigns chan protocol.TaskAssign
	cancels chan protocol.TaskCancel
}

func newTCPPeer(s *System, id string) Peer {
	return &tcpPeer{s: s, id: id, assigns: make(chan protocol.TaskAssign, 100), cancels: make(chan protocol.TaskCancel, 100)}
}

func (p *tcpPeer) ID() string                                { return p.id }
func (p *tcpPeer) Assignments() <-chan protocol.TaskAssign   { return p.assigns }
func (p *tcpPeer) Cancellations() <-chan protocol.TaskCancel { return p.cancels }

// Register opens a new connection and registers on it; an older connection of this
// peer is closed only afterwards, so the new session supersedes it.
func (p *tcpPeer) Register(capacity int) {
	p.s.t.Helper()
	conn := specpeer.Dial(p.s.t, p.s.Bridge.WorkerAddr().String())
	conn.Register(p.id, capacity)
	p.serve(conn)
}

// RegisterServing registers with the taskTypes extension, as a worker in any language
// may.
func (p *tcpPeer) RegisterServing(capacity int, types ...protocol.TaskTypeDecl) {
	p.s.t.Helper()
	conn := specpeer.Dial(p.s.t, p.s.Bridge.WorkerAddr().String())
	conn.MustSend(&protocol.WorkerRegister{WorkerID: p.id, Capacity: capacity, TaskTypes: append([]protocol.TaskTypeDecl{}, types...)})
	if m, ok := conn.MustRecv().(*protocol.WorkerRegistered); !ok || m.WorkerID != p.id {
		p.s.t.Fatalf("register %s serving %v: answered %+v", p.id, protocol.Names(types), m)
	}
	p.serve(conn)
}

// serve makes conn the peer's connection and forwards what it receives.
func (p *tcpPeer) serve(conn *specpeer.Peer) {
	p.mu.Lock()
	old := p.conn
	p.conn = conn
	p.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	ended := p.s.t.Context().Done() // so a full channel cannot hold the reader past the test
	conn.Forward(func(m protocol.Message) {
		switch m := m.(type) {
		case *protocol.TaskAssign:
			select {
			case p.assigns <- *m:
			case <-ended:
			}
		case *protocol.TaskCancel:
			select {
			case p.cancels <- *m:
			case <-ended:
			}
		}
	})
}

func (p *tcpPeer) current() *specpeer.Peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn
}

func (p *tcpPeer) Heartbeat() error {
	return p.current().Send(&protocol.Heartbeat{WorkerID: p.id})
}

// Disconnect closes the connection: the bridge reports the worker lost at once.
func (p *tcpPeer) Disconnect() { _ = p.current().Close() }

func (p *tcpPeer) Report(a protocol.TaskAssign, success bool, text string) *protocol.ResultAck {
	if err := p.current().Send(Result(p.id, a, success, text)); err != nil && !errors.Is(err, net.ErrClosed) {
		p.s.t.Fatal(err) // after disconnect the result cannot leave, which is as stale as it gets
	}
	return nil
}
