package client_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/worker"
)

// TestTCPPipelinedSubmissions: 64 goroutines submit on one DialTCP client to a real
// coordinator through a real bridge; every submission gets its own job, the one
// holding that caller's payload (a worker hashes it, and the result is its hash).
func TestTCPPipelinedSubmissions(t *testing.T) {
	t.Parallel()
	const callers, each = 64, 4
	s := jobbustest.Start(t, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) { c.MaxActiveJobs = 1 << 20 }))
	s.StartNativeWorker(t, worker.WithCapacity(16))
	b := s.StartBridge(t, func(c *bridge.Config) { c.WorkerListen = "" })
	c := dial(t, b.ClientAddr().String(), client.WithTimeout(waitLimit))

	var wg sync.WaitGroup
	var mu sync.Mutex
	texts := make(map[string]string) // job id -> the text its submitter sent
	for g := range callers {
		wg.Go(func() {
			for i := range each {
				text := fmt.Sprintf("caller %d submission %d", g, i)
				id, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": text})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if prev, dup := texts[id]; dup {
					t.Errorf("job %s returned for %q and %q", id, prev, text)
				}
				texts[id] = text
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for id, text := range texts {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*waitLimit)
			defer cancel()
			job, err := c.Wait(ctx, id)
			sum := sha256.Sum256([]byte(text))
			if err != nil || job.JobID != id || job.State != protocol.StateCompleted ||
				job.Result == nil || *job.Result != hex.EncodeToString(sum[:]) {
				t.Errorf("job %s, submitted with %q: %+v, %v; want the hash of that text", id, text, job, err)
			}
		})
	}
	wg.Wait()
	if len(texts) != callers*each {
		t.Fatalf("%d jobs, want %d", len(texts), callers*each)
	}
}

// framePeer is a client port on a raw listener that the test drives by hand: it reads
// requests and writes replies (how and when the test says), so a test can reply to
// requests in flight together, split frames, or hang up mid-pipeline.
type framePeer struct {
	t       *testing.T
	ln      net.Listener
	accepts atomic.Int32
	conns   chan *peerConn
	wg      sync.WaitGroup
}

type peerConn struct {
	t  *testing.T
	nc net.Conn
	r  *frame.Reader
}

func newFramePeer(t *testing.T) *framePeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &framePeer{t: t, ln: ln, conns: make(chan *peerConn, 16)}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepts.Add(1)
			p.conns <- &peerConn{t: t, nc: nc, r: frame.NewReader(nc)}
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.wg.Wait()
		close(p.conns)
		for c := range p.conns {
			_ = c.nc.Close()
		}
	})
	return p
}

func (p *framePeer) addr() string { return p.ln.Addr().String() }

// servesNextOnASecondConnection checks that c's next request, after its first
// connection ended, dials again and gets its reply on the second connection p accepts.
func (p *framePeer) servesNextOnASecondConnection(t *testing.T, c *client.Client) {
	t.Helper()
	next := goStatus(context.Background(), c, "next")
	conn := p.accept()
	conn.write(0, echo(conn.read(1)[0]))
	if next.wait(t); next.err != nil || next.job.JobID != "next" {
		t.Fatalf("Status after the first connection ended = %+v, %v", next.job, next.err)
	}
	if got := p.accepts.Load(); got != 2 {
		t.Fatalf("%d connections, want 2", got)
	}
}

// accept returns the next connection the client made.
func (p *framePeer) accept() *peerConn {
	p.t.Helper()
	select {
	case c := <-p.conns:
		p.t.Cleanup(func() { _ = c.nc.Close() })
		return c
	case <-time.After(waitLimit):
		p.t.Fatal("the client did not connect")
		return nil
	}
}

// read returns the next n requests, in the order they came.
func (c *peerConn) read(n int) []protocol.Message {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(waitLimit))
	reqs := make([]protocol.Message, n)
	for i := range reqs {
		payload, err := c.r.Read()
		if err != nil {
			c.t.Fatalf("request %d of %d: %v", i+1, n, err)
		}
		if reqs[i], err = protocol.Decode(payload); err != nil {
			c.t.Fatal(err)
		}
	}
	return reqs
}

// write sends the replies' frames, together, in writes of at most chunk bytes (all
// in one write if chunk is 0).
func (c *peerConn) write(chunk int, replies ...protocol.Message) {
	c.t.Helper()
	var out []byte
	for _, r := range replies {
		out, _ = frame.Append(out, mustEncode(r))
	}
	if chunk == 0 {
		chunk = len(out)
	}
	for len(out) > 0 {
		n := min(chunk, len(out))
		if _, err := c.nc.Write(out[:n]); err != nil {
			c.t.Fatal(err)
		}
		out = out[n:]
	}
}

// echo is the reply to a GET_JOB_STATUS: the job asked for.
func echo(req protocol.Message) protocol.Message {
	return &protocol.JobStatus{Job: protocol.Job{JobID: req.(*protocol.GetJobStatus).JobID, State: protocol.StateQueued}}
}

// statusCall is a Status request running in a goroutine of its own.
type statusCall struct {
	id  string
	job protocol.Job
	err error
	end chan struct{}
}

func goStatus(ctx context.Context, c *client.Client, id string) *statusCall {
	s := &statusCall{id: id, end: make(chan struct{})}
	go func() {
		defer close(s.end)
		s.job, s.err = c.Status(ctx, id)
	}()
	return s
}

// wait returns once the call has, failing the test if it takes waitLimit.
func (s *statusCall) wait(t *testing.T) *statusCall {
	t.Helper()
	select {
	case <-s.end:
	case <-time.After(waitLimit):
		t.Fatalf("Status(%s) did not return", s.id)
	}
	return s
}

// statusesInFlight dials a frame peer and puts n concurrent Status calls in flight on
// the client's one connection; it returns the peer, the client, the peer's side of the
// connection, the calls by job id, and the requests as the peer read them, all of them
// before it answers any.
func statusesInFlight(t *testing.T, n int) (*framePeer, *client.Client, *peerConn, map[string]*statusCall, []protocol.Message) {
	t.Helper()
	p := newFramePeer(t)
	c := dial(t, p.addr())
	conn := p.accept()
	calls := goStatuses(c, n)
	return p, c, conn, calls, conn.read(n)
}

func goStatuses(c *client.Client, n int) map[string]*statusCall {
	calls := make(map[string]*statusCall, n)
	for i := range n {
		id := fmt.Sprint("j", i)
		calls[id] = goStatus(context.Background(), c, id)
	}
	return calls
}

// TestTCPRepliesPairByOrder: requests from concurrent callers are all in flight at
// once (the peer reads every one before it answers any), and the replies, however
// they are cut into writes, reach the callers that asked.
func TestTCPRepliesPairByOrder(t *testing.T) {
	t.Parallel()
	const callers = 16
	for name, chunk := range map[string]int{
		"all in one write":       0,
		"frames split in pieces": 3,
		"one byte at a time":     1,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, _, conn, calls, reqs := statusesInFlight(t, callers)
			replies := make([]protocol.Message, len(reqs))
			for i, r := range reqs {
				replies[i] = echo(r)
			}
			conn.write(chunk, replies...)
			for id, call := range calls {
				if call.wait(t); call.err != nil || call.job.JobID != id {
					t.Errorf("Status(%s) = %+v, %v", id, call.job, call.err)
				}
			}
			if got := p.accepts.Load(); got != 1 {
				t.Fatalf("%d connections, want 1", got)
			}
		})
	}
}

// TestTCPAbandonedReplyIsDiscarded: a caller whose ctx ends before its reply gets
// ctx's error; the reply, when it comes, is read and discarded, and the next caller
// on the same connection gets its own.
func TestTCPAbandonedReplyIsDiscarded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		deadline bool // else cancelled
		together bool // the two replies in one write
	}{
		{"cancelled, replies apart", false, false},
		{"cancelled, replies together", false, true},
		{"deadline, replies apart", true, false},
		{"deadline, replies together", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newFramePeer(t)
			c := dial(t, p.addr())
			conn := p.accept()

			ctx, cancel := context.WithCancel(context.Background())
			want := context.Canceled
			if tc.deadline {
				// Long enough for the request to be sent first, even on a loaded machine.
				ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
				want = context.DeadlineExceeded
			}
			defer cancel()
			first := goStatus(ctx, c, "a")
			reqA := conn.read(1)[0]
			if !tc.deadline {
				cancel()
			}
			if first.wait(t); !errors.Is(first.err, want) {
				t.Fatalf("Status(a) whose ctx ended = %+v, %v; want %v", first.job, first.err, want)
			}
			second := goStatus(context.Background(), c, "b")
			reqB := conn.read(1)[0]
			if tc.together {
				conn.write(0, echo(reqA), echo(reqB))
			} else {
				conn.write(0, echo(reqA))
				conn.write(0, echo(reqB))
			}
			if second.wait(t); second.err != nil || second.job.JobID != "b" {
				t.Fatalf("Status(b) after a and its late reply = %+v, %v", second.job, second.err)
			}
			if got := p.accepts.Load(); got != 1 {
				t.Fatalf("%d connections, want 1: a ctx that ends costs no connection", got)
			}
		})
	}
}

// TestTCPConnectionLostMidPipeline: the peer answers some of the requests in flight
// and hangs up; those answered get their replies, the others fail as broken with an
// unknown outcome, and the next request dials again.
func TestTCPConnectionLostMidPipeline(t *testing.T) {
	t.Parallel()
	const callers = 8
	for _, answered := range []int{0, 3, callers - 1} {
		t.Run(fmt.Sprint("answered=", answered), func(t *testing.T) {
			t.Parallel()
			p, c, conn, calls, reqs := statusesInFlight(t, callers)
			replied := make(map[string]bool)
			var replies []protocol.Message
			for _, r := range reqs[:answered] {
				replied[r.(*protocol.GetJobStatus).JobID] = true
				replies = append(replies, echo(r))
			}
			conn.write(0, replies...)
			_ = conn.nc.Close()
			for id, call := range calls {
				call.wait(t)
				switch {
				case replied[id] && (call.err != nil || call.job.JobID != id):
					t.Errorf("answered Status(%s) = %+v, %v", id, call.job, call.err)
				case !replied[id] && (call.err == nil || !strings.Contains(call.err.Error(), "broken, outcome unknown")):
					t.Errorf("unanswered Status(%s) = %+v, %v; want a broken-connection error", id, call.job, call.err)
				}
			}
			p.servesNextOnASecondConnection(t, c)
		})
	}
}

// TestTCPReplyThatEndsTheConnection: a reply after which the bridge closes the
// connection (the ERROR to a malformed frame, or the worker port's greeting) reaches
// its caller as before; the requests behind it fail as broken (whether the bridge read
// them is unknown), even if more replies follow, and the next request dials again.
func TestTCPReplyThatEndsTheConnection(t *testing.T) {
	t.Parallel()
	const callers = 4
	for _, tc := range []struct {
		name  string
		reply protocol.Message
		check func(error) bool
	}{
		{"malformed request", protocol.MalformedRequest(errors.New("bad")), func(err error) bool {
			var se *client.ServerError
			return errors.As(err, &se) && se.Message == protocol.MalformedRequest(errors.New("bad")).Message
		}},
		{"worker port", protocol.FirstMessageMustRegister(), func(err error) bool { return errors.Is(err, client.ErrWorkerPort) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, c, conn, calls, reqs := statusesInFlight(t, callers)
			replies := []protocol.Message{tc.reply}
			for _, r := range reqs[1:] {
				replies = append(replies, echo(r)) // late, after the connection ended
			}
			conn.write(0, replies...)
			head := reqs[0].(*protocol.GetJobStatus).JobID
			for id, call := range calls {
				call.wait(t)
				switch {
				case id == head && !tc.check(call.err):
					t.Errorf("Status(%s), answered %s: %v", id, tc.name, call.err)
				case id != head && (call.err == nil || !strings.Contains(call.err.Error(), "broken, outcome unknown")):
					t.Errorf("Status(%s) behind the ending reply = %+v, %v; want a broken-connection error", id, call.job, call.err)
				}
			}
			p.servesNextOnASecondConnection(t, c)
		})
	}
}

// TestTCPCloseInterruptsThePipeline: Close fails every request in flight with
// ErrClosed at once.
func TestTCPCloseInterruptsThePipeline(t *testing.T) {
	t.Parallel()
	const callers = 16
	_, c, _, calls, _ := statusesInFlight(t, callers) // all in flight
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for id, call := range calls {
		if call.wait(t); !errors.Is(call.err, client.ErrClosed) {
			t.Errorf("Status(%s) in flight at Close = %v, want ErrClosed", id, call.err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Status(context.Background(), "after"); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Status after Close = %v, want ErrClosed", err)
	}
}

// TestTCPBoundsRequestsInFlight: with 64 requests in flight, the next caller waits
// for a slot, unsent, and gives up when its ctx ends; when all 64 are given up on,
// the connection is dropped as one that no longer answers, and the next request
// dials again.
func TestTCPBoundsRequestsInFlight(t *testing.T) {
	t.Parallel()
	const bound = 64
	p := newFramePeer(t)
	c := dial(t, p.addr())
	conn := p.accept()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := make([]*statusCall, bound)
	for i := range calls {
		calls[i] = goStatus(ctx, c, fmt.Sprint("j", i))
	}
	conn.read(bound)
	extra, cancelExtra := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelExtra()
	if _, err := c.Status(extra, "beyond"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Status beyond the bound = %v, want context.DeadlineExceeded", err)
	}

	cancel() // all 64 given up on
	for _, call := range calls {
		if call.wait(t); !errors.Is(call.err, context.Canceled) {
			t.Errorf("Status(%s) = %v, want context.Canceled", call.id, call.err)
		}
	}
	// The connection is gone, and "beyond" was never sent on it.
	_ = conn.nc.SetReadDeadline(time.Now().Add(waitLimit))
	if payload, err := conn.r.Read(); err == nil {
		t.Fatalf("the dropped connection carried %s", payload)
	}
	p.servesNextOnASecondConnection(t, c)
}
