package bridge_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor bounds every wait of the tests: generous, since the machine is shared.
const waitFor = 20 * time.Second

// system is an in-process jobbus system with a bridge on random ports.
type system struct {
	*jobbustest.System
	t      testing.TB
	br     *bridge.Bridge
	native *client.Client // the coordinator's own API over NATS, for comparison
}

type settings struct {
	system []jobbustest.Option
	bridge bridge.Config
}

type option func(*settings)

type bridgeConfig = bridge.Config

func withCoordinator(f func(*coordinator.Config)) option {
	return func(s *settings) { s.system = append(s.system, jobbustest.WithCoordinatorConfig(f)) }
}

func withBridge(f func(*bridge.Config)) option {
	return func(s *settings) { f(&s.bridge) }
}

// noCoordinator starts the bridge alone: nobody answers its requests.
func noCoordinator() option {
	return func(s *settings) { s.system = append(s.system, jobbustest.WithoutCoordinator()) }
}

// calmCoordinator loses no worker and cuts no task short on a noisy machine: tests
// that need heartbeats set them.
func calmCoordinator(cfg *coordinator.Config) {
	cfg.HeartbeatTimeout = time.Hour
	cfg.TaskTimeout = time.Minute
}

func fastBridge() bridge.Config {
	cfg := bridge.DefaultConfig()
	cfg.WorkerListen = "127.0.0.1:0"
	cfg.ClientListen = "127.0.0.1:0"
	cfg.FrameStallTimeout = 2 * time.Second
	cfg.WriteTimeout = 2 * time.Second
	cfg.RequestTimeout = 2 * time.Second
	cfg.ResultRetryFor = 5 * time.Second
	cfg.Logger = testLogger()
	return cfg
}

// testLogger logs to stderr when BRIDGE_TEST_LOG is set (debug with =debug).
func testLogger() *slog.Logger {
	v := os.Getenv("BRIDGE_TEST_LOG")
	if v == "" {
		return nil
	}
	level := slog.LevelInfo
	if v == "debug" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func setup(t testing.TB, opts ...option) *system {
	t.Helper()
	set := settings{system: []jobbustest.Option{jobbustest.WithCoordinatorConfig(calmCoordinator)}, bridge: fastBridge()}
	for _, o := range opts {
		o(&set)
	}
	sys := jobbustest.Start(t, set.system...)
	return &system{System: sys, t: t, br: startBridge(t, sys.NC, set.bridge), native: client.New(sys.NC, client.WithTimeout(waitFor))}
}

func startBridge(t testing.TB, nc *nats.Conn, cfg bridge.Config) *bridge.Bridge {
	t.Helper()
	br, err := bridge.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = br.Close() })
	return br
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, waitFor, what, cond)
}

func (s *system) job(id string) protocol.Job {
	s.t.Helper()
	j, err := s.native.Status(context.Background(), id)
	if err != nil {
		s.t.Fatalf("status %s: %v", id, err)
	}
	return j
}

func (s *system) hasWorker(id string) bool { return jobbustest.WorkerListed(s.native, id) }

// waitState waits until job id is in state st.
func (s *system) waitState(id string, st protocol.State) protocol.Job {
	s.t.Helper()
	var j protocol.Job
	deadline := time.Now().Add(waitFor)
	for j = s.job(id); j.State != st; j = s.job(id) {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for job %s to be %s: %+v (error %v)", id, st, j, deref(j.Error))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return j
}

func deref(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// peer plays a spec peer on one TCP connection, byte-exactly, with frame.Write and a
// frame.Reader. Its methods return errors so that goroutines may use them.
type peer struct {
	t    testing.TB
	conn net.Conn
	r    *frame.Reader
	wmu  sync.Mutex
}

func dial(t testing.TB, addr net.Addr) *peer {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr.String(), waitFor)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &peer{t: t, conn: c, r: frame.NewReader(c)}
}

func (s *system) client() *peer { return dial(s.t, s.br.ClientAddr()) }

// write writes raw bytes (no framing).
func (p *peer) write(b []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_ = p.conn.SetWriteDeadline(time.Now().Add(waitFor))
	_, err := p.conn.Write(b)
	return err
}

func (p *peer) sendPayload(payload []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_ = p.conn.SetWriteDeadline(time.Now().Add(waitFor))
	return frame.Write(p.conn, payload)
}

func (p *peer) send(m protocol.Message) error {
	data, err := protocol.Encode(m)
	if err != nil {
		return err
	}
	return p.sendPayload(data)
}

func (p *peer) mustSend(m protocol.Message) {
	p.t.Helper()
	if err := p.send(m); err != nil {
		p.t.Fatalf("send %s: %v", m.MessageType(), err)
	}
}

func (p *peer) recvRaw() ([]byte, error) {
	_ = p.conn.SetReadDeadline(time.Now().Add(waitFor))
	b, err := p.r.Read()
	return bytes.Clone(b), err
}

func (p *peer) recv() (protocol.Message, error) {
	b, err := p.recvRaw()
	if err != nil {
		return nil, err
	}
	return protocol.Decode(b)
}

func (p *peer) mustRecv() protocol.Message {
	p.t.Helper()
	m, err := p.recv()
	if err != nil {
		p.t.Fatalf("receive: %v", err)
	}
	return m
}

// request sends m and returns the reply.
func (p *peer) request(m protocol.Message) protocol.Message {
	p.t.Helper()
	p.mustSend(m)
	return p.mustRecv()
}

// expectError receives an ERROR whose message starts with prefix.
func (p *peer) expectError(prefix string) {
	p.t.Helper()
	m := p.mustRecv()
	e, ok := m.(*protocol.Error)
	if !ok {
		p.t.Fatalf("got %T %+v, want ERROR %q...", m, m, prefix)
	}
	if !strings.HasPrefix(e.Message, prefix) {
		p.t.Fatalf("ERROR %q, want prefix %q", e.Message, prefix)
	}
}

// expectClosed reads until the bridge closes the connection, failing on a timeout,
// and returns the frames read meanwhile.
func (p *peer) expectClosed() [][]byte {
	p.t.Helper()
	var frames [][]byte
	for {
		b, err := p.recvRaw()
		switch {
		case err == nil:
			frames = append(frames, b)
			continue
		case errors.Is(err, os.ErrDeadlineExceeded):
			p.t.Fatalf("connection still open after %v", waitFor)
		}
		return frames
	}
}

// expectErrorThenClosed: a best-effort ERROR with prefix, then the close.
func (p *peer) expectErrorThenClosed(prefix string) {
	p.t.Helper()
	frames := p.expectClosed()
	if len(frames) != 1 {
		p.t.Fatalf("got %d frames before the close, want one ERROR %q...: %q", len(frames), prefix, frames)
	}
	m, err := protocol.Decode(frames[0])
	if e, ok := m.(*protocol.Error); err != nil || !ok || !strings.HasPrefix(e.Message, prefix) {
		p.t.Fatalf("got %s before the close, want ERROR %q...", frames[0], prefix)
	}
}

// register sends WORKER_REGISTER and expects WORKER_REGISTERED, byte for byte.
func (p *peer) register(id string, capacity int) {
	p.t.Helper()
	p.mustSend(&protocol.WorkerRegister{WorkerID: id, Capacity: capacity})
	b, err := p.recvRaw()
	if err != nil {
		p.t.Fatalf("register %s: %v", id, err)
	}
	want := fmt.Sprintf(`{"type":"WORKER_REGISTERED","workerId":%q}`, id)
	if string(b) != want {
		p.t.Fatalf("register reply %s, want %s", b, want)
	}
}

func (s *system) worker(id string, capacity int) *peer {
	s.t.Helper()
	p := dial(s.t, s.br.WorkerAddr())
	p.register(id, capacity)
	return p
}

// submit submits through the client port connection p and returns the job id.
func (p *peer) submit(taskType, payload string) string {
	p.t.Helper()
	m := p.request(&protocol.SubmitJob{TaskType: taskType, Payload: []byte(payload)})
	js, ok := m.(*protocol.JobSubmitted)
	if !ok {
		p.t.Fatalf("submit: got %T %+v", m, m)
	}
	return js.JobID
}

// specWorker is a healthy spec TCP worker: it heartbeats and completes every task
// it is assigned with the result "done".
type specWorker struct {
	*peer
	id   string
	done chan struct{}
	wg   sync.WaitGroup
}

func (s *system) specWorker(id string, capacity int) *specWorker {
	s.t.Helper()
	w := &specWorker{peer: s.worker(id, capacity), id: id, done: make(chan struct{})}
	w.wg.Add(2)
	go w.serve()
	go w.beat(50 * time.Millisecond)
	s.t.Cleanup(w.stop)
	return w
}

func (w *specWorker) serve() {
	defer w.wg.Done()
	for {
		_ = w.conn.SetReadDeadline(time.Time{})
		b, err := w.r.Read()
		if err != nil {
			return
		}
		m, err := protocol.Decode(b)
		if err != nil {
			return
		}
		if a, ok := m.(*protocol.TaskAssign); ok {
			result := "done"
			_ = w.send(&protocol.TaskResult{WorkerID: w.id, JobID: a.JobID, AttemptID: a.AttemptID, Success: true, Result: &result})
		}
	}
}

func (w *specWorker) beat(every time.Duration) {
	defer w.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-t.C:
			if w.send(&protocol.Heartbeat{WorkerID: w.id}) != nil {
				return
			}
		}
	}
}

func (w *specWorker) stop() {
	select {
	case <-w.done:
		return
	default:
	}
	close(w.done)
	_ = w.conn.Close()
	w.wg.Wait()
}

// healthy proves the system still works: n jobs submitted through a fresh client
// connection all complete on whatever worker is healthy.
func (s *system) healthy(n int) {
	s.t.Helper()
	c := s.client()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = c.submit("SHA256", fmt.Sprintf(`{"text":"healthy %d"}`, i))
	}
	for _, id := range ids {
		if j := s.waitState(id, protocol.StateCompleted); j.Result == nil || *j.Result != "done" {
			s.t.Fatalf("job %s result %v", id, j.Result)
		}
	}
	_ = c.conn.Close()
}

// header is a raw length prefix, including lengths a Writer refuses.
func header(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

// isClosedErr reports an error that means the peer closed the connection.
func isClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, frame.ErrTruncated) ||
		errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe")
}
