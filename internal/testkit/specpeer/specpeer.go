// Package specpeer plays a spec peer in tests: one TCP connection to a jobbus port that
// speaks the frames of PROTOCOL.md byte for byte (frame.Write and a frame.Reader), with
// nothing of jobbus's own client or worker in between, so a test sees exactly what a
// peer written in another language would.
//
// It is a leaf of the test toolkit: it imports only the standard library, bus/protocol
// and bus/protocol/frame, so any package's tests may use it.
//
//	w := specpeer.Dial(t, bridge.WorkerAddr().String())
//	w.Register("w1", 4)
//	a := w.MustRecv().(*protocol.TaskAssign)
//
// A Peer's methods that return errors may be used from goroutines; the Must and Expect
// methods fail the test and belong to the test's goroutine.
package specpeer

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
)

// DefaultTimeout bounds every dial, write and read of a Peer unless WithTimeout says
// otherwise: generous, since test machines are shared.
const DefaultTimeout = 20 * time.Second

// Option configures Dial.
type Option func(*Peer)

// WithTimeout bounds each dial, write and read of the peer.
func WithTimeout(d time.Duration) Option { return func(p *Peer) { p.timeout = d } }

// Peer is a spec peer on one TCP connection, closed when the test ends.
type Peer struct {
	t       testing.TB
	conn    net.Conn
	r       *frame.Reader
	wmu     sync.Mutex
	timeout time.Duration
	wg      sync.WaitGroup // Forward's reader
}

// Dial connects to addr (a bridge's worker or client port).
func Dial(t testing.TB, addr string, opts ...Option) *Peer {
	t.Helper()
	p := &Peer{t: t, timeout: DefaultTimeout}
	for _, o := range opts {
		o(p)
	}
	c, err := net.DialTimeout("tcp", addr, p.timeout)
	if err != nil {
		t.Fatalf("specpeer: dial %s: %v", addr, err)
	}
	return Use(t, c, opts...)
}

// Use makes a peer of a connection the test opened itself (one it will write a broken
// frame on, say). The connection is closed when the test ends.
func Use(t testing.TB, c net.Conn, opts ...Option) *Peer {
	p := &Peer{t: t, conn: c, r: frame.NewReader(c), timeout: DefaultTimeout}
	for _, o := range opts {
		o(p)
	}
	t.Cleanup(func() {
		_ = p.Close()
		p.wg.Wait()
	})
	return p
}

// Conn is the peer's connection, for what a spec peer may do besides framing (half
// close it, set its buffers, write slowly).
func (p *Peer) Conn() net.Conn { return p.conn }

// Close closes the connection; a Forward reader stops with it.
func (p *Peer) Close() error { return p.conn.Close() }

// Write writes raw bytes, no framing.
func (p *Peer) Write(b []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_ = p.conn.SetWriteDeadline(time.Now().Add(p.timeout))
	_, err := p.conn.Write(b)
	return err
}

// SendPayload writes one frame holding payload.
func (p *Peer) SendPayload(payload []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_ = p.conn.SetWriteDeadline(time.Now().Add(p.timeout))
	return frame.Write(p.conn, payload)
}

// Send writes one frame holding m.
func (p *Peer) Send(m protocol.Message) error {
	data, err := protocol.Encode(m)
	if err != nil {
		return err
	}
	return p.SendPayload(data)
}

// MustSend sends m or fails the test.
func (p *Peer) MustSend(m protocol.Message) {
	p.t.Helper()
	if err := p.Send(m); err != nil {
		p.t.Fatalf("send %s: %v", m.MessageType(), err)
	}
}

// RecvRaw reads one frame's payload.
func (p *Peer) RecvRaw() ([]byte, error) {
	_ = p.conn.SetReadDeadline(time.Now().Add(p.timeout))
	b, err := p.r.Read()
	return bytes.Clone(b), err
}

// Recv reads and decodes one frame.
func (p *Peer) Recv() (protocol.Message, error) {
	b, err := p.RecvRaw()
	if err != nil {
		return nil, err
	}
	return protocol.Decode(b)
}

// MustRecv receives one message or fails the test.
func (p *Peer) MustRecv() protocol.Message {
	p.t.Helper()
	m, err := p.Recv()
	if err != nil {
		p.t.Fatalf("receive: %v", err)
	}
	return m
}

// Request sends m and returns the reply.
func (p *Peer) Request(m protocol.Message) protocol.Message {
	p.t.Helper()
	p.MustSend(m)
	return p.MustRecv()
}

// ExpectError receives an ERROR whose message starts with prefix.
func (p *Peer) ExpectError(prefix string) {
	p.t.Helper()
	m := p.MustRecv()
	e, ok := m.(*protocol.Error)
	if !ok {
		p.t.Fatalf("got %T %+v, want ERROR %q...", m, m, prefix)
	}
	if !strings.HasPrefix(e.Message, prefix) {
		p.t.Fatalf("ERROR %q, want prefix %q", e.Message, prefix)
	}
}

// ExpectClosed reads until the other side closes the connection, failing on a
// timeout, and returns the frames read meanwhile.
func (p *Peer) ExpectClosed() [][]byte {
	p.t.Helper()
	var frames [][]byte
	for {
		b, err := p.RecvRaw()
		switch {
		case err == nil:
			frames = append(frames, b)
			continue
		case errors.Is(err, os.ErrDeadlineExceeded):
			p.t.Fatalf("connection still open after %v", p.timeout)
		}
		return frames
	}
}

// ExpectErrorThenClosed expects a best-effort ERROR with prefix, then the close.
func (p *Peer) ExpectErrorThenClosed(prefix string) {
	p.t.Helper()
	frames := p.ExpectClosed()
	if len(frames) != 1 {
		p.t.Fatalf("got %d frames before the close, want one ERROR %q...: %q", len(frames), prefix, frames)
	}
	m, err := protocol.Decode(frames[0])
	if e, ok := m.(*protocol.Error); err != nil || !ok || !strings.HasPrefix(e.Message, prefix) {
		p.t.Fatalf("got %s before the close, want ERROR %q...", frames[0], prefix)
	}
}

// Register sends WORKER_REGISTER and expects WORKER_REGISTERED, byte for byte.
func (p *Peer) Register(id string, capacity int) {
	p.t.Helper()
	p.MustSend(&protocol.WorkerRegister{WorkerID: id, Capacity: capacity})
	b, err := p.RecvRaw()
	if err != nil {
		p.t.Fatalf("register %s: %v", id, err)
	}
	want := fmt.Sprintf(`{"type":"WORKER_REGISTERED","workerId":%q}`, id)
	if string(b) != want {
		p.t.Fatalf("register reply %s, want %s", b, want)
	}
}

// ExpectAssign receives the next frame, which must be a TASK_ASSIGN for job jobID.
func (p *Peer) ExpectAssign(jobID string) *protocol.TaskAssign {
	p.t.Helper()
	m := p.MustRecv()
	a, ok := m.(*protocol.TaskAssign)
	if !ok || a.JobID != jobID {
		p.t.Fatalf("got %T %+v, want TASK_ASSIGN for %s", m, m, jobID)
	}
	return a
}

// Submit submits through a client port connection and returns the job id.
func (p *Peer) Submit(taskType, payload string) string {
	p.t.Helper()
	m := p.Request(&protocol.SubmitJob{TaskType: taskType, Payload: []byte(payload)})
	js, ok := m.(*protocol.JobSubmitted)
	if !ok {
		p.t.Fatalf("submit: got %T %+v", m, m)
	}
	return js.JobID
}

// Forward reads every further frame in a goroutine of the peer's, handing each
// message that decodes to handle, until the connection closes (Close, the other side,
// or the test's end). Frames that do not decode are skipped. No read deadline
// applies: a worker may wait long for its next assignment.
func (p *Peer) Forward(handle func(protocol.Message)) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_ = p.conn.SetReadDeadline(time.Time{})
		for {
			data, err := p.r.Read()
			if err != nil {
				return
			}
			if m, err := protocol.Decode(data); err == nil {
				handle(m)
			}
		}
	}()
}
