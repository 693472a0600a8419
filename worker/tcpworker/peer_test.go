package tcpworker_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
)

// waitLimit bounds every wait of these tests; generous, since the machine is noisy.
const waitLimit = 10 * time.Second

// peer plays the coordinator side of PROTOCOL.md's worker port on a real TCP
// listener: a spec peer, written from the spec alone, that hands each accepted
// connection to the test.
type peer struct {
	t     *testing.T
	ln    net.Listener
	conns chan *peerConn
	done  chan struct{}
	wg    sync.WaitGroup

	mu  sync.Mutex
	all []*peerConn
}

func newPeer(t *testing.T) *peer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{t: t, ln: ln, conns: make(chan *peerConn, 64), done: make(chan struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.close)
	return p
}

func (p *peer) addr() string { return p.ln.Addr().String() }

func (p *peer) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		pc := &peerConn{t: p.t, conn: c, acceptedAt: time.Now(), msgs: make(chan received, 4096), done: p.done}
		p.mu.Lock()
		p.all = append(p.all, pc)
		p.mu.Unlock()
		p.wg.Add(1)
		go pc.readLoop(&p.wg)
		select {
		case p.conns <- pc:
		case <-p.done:
			return
		}
	}
}

// accept returns the next connection a worker opened.
func (p *peer) accept() *peerConn {
	p.t.Helper()
	select {
	case pc := <-p.conns:
		return pc
	case <-time.After(waitLimit):
		p.t.Fatal("no worker connected")
		return nil
	}
}

// close stops listening, closes every connection and waits for the peer's goroutines.
func (p *peer) close() {
	_ = p.ln.Close()
	close(p.done)
	p.mu.Lock()
	for _, pc := range p.all {
		pc.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// received is one frame from the worker, decoded, or the reason it did not decode.
type received struct {
	m   protocol.Message
	err error
	at  time.Time
}

// peerConn is one worker connection, seen from the coordinator.
type peerConn struct {
	t          *testing.T
	conn       net.Conn
	acceptedAt time.Time
	msgs       chan received // closed when the worker's side ends
	done       chan struct{}
	wmu        sync.Mutex
}

func (pc *peerConn) readLoop(wg *sync.WaitGroup) {
	defer wg.Done()
	defer close(pc.msgs)
	r := frame.NewReader(pc.conn)
	for {
		p, err := r.Read()
		if err != nil {
			return
		}
		m, err := protocol.Decode(p)
		select {
		case pc.msgs <- received{m: m, err: err, at: time.Now()}:
		case <-pc.done:
			return
		}
	}
}

func (pc *peerConn) close() { _ = pc.conn.Close() }

// next returns the worker's next frame; it fails the test if the frame is not a valid
// message or the connection ends.
func (pc *peerConn) next() received {
	pc.t.Helper()
	select {
	case r, ok := <-pc.msgs:
		if !ok {
			pc.t.Fatal("worker closed the connection")
		}
		if r.err != nil {
			pc.t.Fatalf("worker sent a malformed frame: %v", r.err)
		}
		return r
	case <-time.After(waitLimit):
		pc.t.Fatal("worker sent nothing")
		return received{}
	}
}

// nextResult returns the next TASK_RESULT, checking that every heartbeat before it
// names the worker.
func (pc *peerConn) nextResult(workerID string) *protocol.TaskResult {
	pc.t.Helper()
	for {
		switch m := pc.next().m.(type) {
		case *protocol.Heartbeat:
			if m.WorkerID != workerID {
				pc.t.Fatalf("heartbeat from %q, want %q", m.WorkerID, workerID)
			}
		case *protocol.TaskResult:
			return m
		default:
			pc.t.Fatalf("worker sent %s, want TASK_RESULT or HEARTBEAT", m.MessageType())
		}
	}
}

// expectRegister checks that the worker's first frame is WORKER_REGISTER.
func (pc *peerConn) expectRegister() *protocol.WorkerRegister {
	pc.t.Helper()
	m := pc.next().m
	reg, ok := m.(*protocol.WorkerRegister)
	if !ok {
		pc.t.Fatalf("first frame is %s, want WORKER_REGISTER", m.MessageType())
	}
	return reg
}

// register completes a registration as the coordinator does.
func (pc *peerConn) register() *protocol.WorkerRegister {
	pc.t.Helper()
	reg := pc.expectRegister()
	pc.send(&protocol.WorkerRegistered{WorkerID: reg.WorkerID})
	return reg
}

func (pc *peerConn) send(m protocol.Message) {
	pc.t.Helper()
	data, err := protocol.Encode(m)
	if err != nil {
		pc.t.Fatal(err)
	}
	pc.sendRaw(data)
}

func (pc *peerConn) sendRaw(payload []byte) {
	pc.t.Helper()
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	if err := frame.Write(pc.conn, payload); err != nil {
		pc.t.Fatalf("send to worker: %v", err)
	}
}

// waitClosed waits for the worker to close the connection, failing on anything but
// heartbeats before that.
func (pc *peerConn) waitClosed() {
	pc.t.Helper()
	timeout := time.After(waitLimit)
	for {
		select {
		case r, ok := <-pc.msgs:
			if !ok {
				return
			}
			if _, hb := r.m.(*protocol.Heartbeat); !hb {
				pc.t.Fatalf("worker sent %v (err %v), want the connection closed", r.m, r.err)
			}
		case <-timeout:
			pc.t.Fatal("worker kept the connection open")
		}
	}
}
