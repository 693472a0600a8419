package coordinator_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/worker/tcpworker"
)

// The TCP transports: the bridge's ports, alone and mixed with native peers.
func init() {
	transports = append(transports,
		transport{name: "TCP", bridged: true, client: tcpClient, worker: tcpWorker, peer: newTCPPeer},
		// A TCP client with native workers, and a native client with TCP workers.
		transport{name: "TCPClientNativeWorkers", bridged: true, client: tcpClient, worker: nativeWorker, peer: newBusPeer},
		transport{name: "NativeClientTCPWorkers", bridged: true, client: natsClient, worker: tcpWorker, peer: newTCPPeer},
	)
}

func tcpClient(s *system) *client.Client {
	c, err := client.DialTCP(context.Background(), s.bridge.ClientAddr().String())
	must(s.t, err)
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

func tcpWorker(s *system, capacity int) (runner, func()) {
	w, err := tcpworker.New(s.bridge.WorkerAddr().String(), tcpworker.WithCapacity(capacity),
		tcpworker.WithHeartbeat(50*time.Millisecond), tcpworker.WithReconnectDelay(20*time.Millisecond), tcpworker.WithLogger(nil))
	must(s.t, err)
	return w, jobbustest.Go(s.t, w.Run)
}

// tcpPeer is a test-driven spec worker on the bridge's worker port, writing and reading
// frames byte for byte as PROTOCOL.md says.
type tcpPeer struct {
	s       *system
	id      string
	mu      sync.Mutex
	conn    net.Conn
	assigns chan protocol.TaskAssign
	cancels chan protocol.TaskCancel
}

func newTCPPeer(s *system, id string) peer {
	return &tcpPeer{s: s, id: id, assigns: make(chan protocol.TaskAssign, 100), cancels: make(chan protocol.TaskCancel, 100)}
}

func (p *tcpPeer) ID() string                                { return p.id }
func (p *tcpPeer) assignments() <-chan protocol.TaskAssign   { return p.assigns }
func (p *tcpPeer) cancellations() <-chan protocol.TaskCancel { return p.cancels }

// register opens a new connection and registers on it; an older connection of this
// peer is closed only afterwards, so the new session supersedes it.
func (p *tcpPeer) register(capacity int) {
	p.s.t.Helper()
	conn, err := net.Dial("tcp", p.s.bridge.WorkerAddr().String())
	must(p.s.t, err)
	p.s.t.Cleanup(func() { _ = conn.Close() })
	p.send(conn, &protocol.WorkerRegister{WorkerID: p.id, Capacity: capacity})
	r := frame.NewReader(conn)
	data, err := r.Read()
	must(p.s.t, err)
	if m, err := protocol.Decode(data); err != nil || m.MessageType() != protocol.TypeWorkerRegistered {
		p.s.t.Fatalf("registration answered %s (%v)", data, err)
	}
	p.mu.Lock()
	old := p.conn
	p.conn = conn
	p.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	go p.read(r)
}

func (p *tcpPeer) read(r *frame.Reader) {
	for {
		data, err := r.Read()
		if err != nil {
			return
		}
		m, err := protocol.Decode(data)
		if err != nil {
			continue
		}
		switch m := m.(type) {
		case *protocol.TaskAssign:
			p.assigns <- *m
		case *protocol.TaskCancel:
			p.cancels <- *m
		}
	}
}

func (p *tcpPeer) send(conn net.Conn, m protocol.Message) {
	data, err := protocol.Encode(m)
	must(p.s.t, err)
	must(p.s.t, frame.Write(conn, data))
}

func (p *tcpPeer) current() net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn
}

func (p *tcpPeer) heartbeat() error {
	data, _ := protocol.Encode(&protocol.Heartbeat{WorkerID: p.id})
	return frame.Write(p.current(), data)
}

// disconnect closes the connection: the bridge reports the worker lost at once.
func (p *tcpPeer) disconnect() { _ = p.current().Close() }

func (p *tcpPeer) report(a protocol.TaskAssign, success bool, text string) *protocol.ResultAck {
	data, err := protocol.Encode(result(p.id, a, success, text))
	must(p.s.t, err)
	if err := frame.Write(p.current(), data); err != nil && !errors.Is(err, net.ErrClosed) {
		p.s.t.Fatal(err) // after disconnect the result cannot leave, which is as stale as it gets
	}
	return nil
}
