package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher()) }

// waitLimit bounds every wait of these tests; generous, since the machine is noisy.
const waitLimit = 10 * time.Second

// response is what a peer does with one request: send reply (or raw bytes), or hang
// up, or say nothing at all.
type response struct {
	reply  protocol.Message
	raw    []byte
	hangUp bool
	silent bool
}

// handler answers the n-th request (from 1) the peer has received.
type handler func(n int, req protocol.Message) response

// bridgePeer plays the bridge's client port of PROTOCOL.md on a real TCP listener:
// strict request/reply, many requests per connection.
type bridgePeer struct {
	t        *testing.T
	ln       net.Listener
	handle   handler
	requests atomic.Int32
	accepts  atomic.Int32
	got      chan protocol.Message // every request, in order
	done     chan struct{}
	wg       sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
}

func newBridgePeer(t *testing.T, h handler) *bridgePeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &bridgePeer{t: t, ln: ln, handle: h, got: make(chan protocol.Message, 1024), done: make(chan struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.close)
	return p
}

func (p *bridgePeer) addr() string { return p.ln.Addr().String() }

func (p *bridgePeer) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepts.Add(1)
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve answers one connection's requests in order until the client goes away.
func (p *bridgePeer) serve(c net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	r := frame.NewReader(c)
	for {
		payload, err := r.Read()
		if err != nil {
			return
		}
		req, err := protocol.Decode(payload)
		if err != nil {
			_ = frame.Write(c, mustEncode(protocol.MalformedRequest(err)))
			return
		}
		select {
		case p.got <- req:
		default:
		}
		resp := p.handle(int(p.requests.Add(1)), req)
		switch {
		case resp.hangUp:
			return
		case resp.silent:
			continue
		case resp.raw != nil:
			_ = frame.Write(c, resp.raw)
		default:
			_ = frame.Write(c, mustEncode(resp.reply))
		}
	}
}

// close stops listening, closes every connection and waits for the peer's goroutines.
func (p *bridgePeer) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func mustEncode(m protocol.Message) []byte {
	b, err := protocol.Encode(m)
	if err != nil {
		panic(err)
	}
	return b
}

// answer is the handler of a healthy coordinator.
func answer(n int, req protocol.Message) response {
	switch r := req.(type) {
	case *protocol.SubmitJob:
		return response{reply: &protocol.JobSubmitted{JobID: fmt.Sprint("job-", n)}}
	case *protocol.GetJobStatus:
		return response{reply: &protocol.JobStatus{Job: protocol.Job{JobID: r.JobID, State: protocol.StateCompleted, Priority: protocol.PriorityNormal}}}
	case *protocol.ListJobs:
		return response{reply: &protocol.JobList{Jobs: []protocol.Job{{JobID: "a"}, {JobID: "b"}}}}
	case *protocol.ListWorkers:
		return response{reply: &protocol.WorkerList{Workers: []protocol.Worker{{WorkerID: "w", Capacity: 4}}}}
	case *protocol.CancelJob:
		return response{reply: &protocol.JobCancel{Cancelled: true, Job: protocol.Job{JobID: r.JobID, State: protocol.StateCancelled}}}
	}
	return response{reply: &protocol.Error{Message: "unexpected " + string(req.MessageType())}}
}

func dial(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.DialTCP(context.Background(), addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// freeAddr is a loopback address where nothing listens.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func TestTCPRequestReply(t *testing.T) {
	t.Parallel()
	p := newBridgePeer(t, answer)
	c := dial(t, p.addr())
	ctx := context.Background()

	id, err := c.Submit(ctx, "SHA256", map[string]string{"text": "hi"}, client.MaxAttempts(2), client.Priority(protocol.PriorityHigh))
	if err != nil || id != "job-1" {
		t.Fatalf("Submit = %q, %v", id, err)
	}
	sub := (<-p.got).(*protocol.SubmitJob)
	if sub.TaskType != "SHA256" || string(sub.Payload) != `{"text":"hi"}` || sub.MaxAttempts != 2 || protocol.OrNormal(sub.Priority) != protocol.PriorityHigh {
		t.Fatalf("bridge received %+v", sub)
	}
	if job, err := c.Status(ctx, "job-1"); err != nil || job.JobID != "job-1" || job.State != protocol.StateCompleted {
		t.Fatalf("Status = %+v, %v", job, err)
	}
	if list, err := c.List(ctx, protocol.ListJobs{}); err != nil || len(list.Jobs) != 2 {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if ws, err := c.Workers(ctx); err != nil || len(ws) != 1 || ws[0].WorkerID != "w" {
		t.Fatalf("Workers = %+v, %v", ws, err)
	}
	if ok, job, err := c.Cancel(ctx, "job-1"); err != nil || !ok || job.State != protocol.StateCancelled {
		t.Fatalf("Cancel = %v %+v, %v", ok, job, err)
	}
	for i := range 50 {
		if job, err := c.Status(ctx, fmt.Sprint("j", i)); err != nil || job.JobID != fmt.Sprint("j", i) {
			t.Fatalf("Status %d = %+v, %v", i, job, err)
		}
	}
	if got := p.accepts.Load(); got != 1 {
		t.Fatalf("%d connections for 55 requests, want 1", got)
	}
}

// TestTCPConcurrentRequests checks replies pair with their requests when goroutines
// share a client.
func TestTCPConcurrentRequests(t *testing.T) {
	t.Parallel()
	p := newBridgePeer(t, answer)
	c := dial(t, p.addr())
	var wg sync.WaitGroup
	errs := make(chan error, 8*20)
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				id := fmt.Sprintf("g%d-%d", g, i)
				job, err := c.Status(context.Background(), id)
				if err == nil && job.JobID != id {
					err = fmt.Errorf("asked for %s, got %s", id, job.JobID)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestTCPServerErrorReply(t *testing.T) {
	t.Parallel()
	p := newBridgePeer(t, func(int, protocol.Message) response {
		return response{reply: protocol.UnknownJob("nope")}
	})
	c := dial(t, p.addr())
	_, err := c.Status(context.Background(), "nope")
	var se *client.ServerError
	if !errors.Is(err, client.ErrServer) || !errors.As(err, &se) || se.Message != "Unknown job: nope" {
		t.Fatalf("Status = %v, want the ERROR reply", err)
	}
}

func TestTCPBrokenConnection(t *testing.T) {
	t.Parallel()
	p := newBridgePeer(t, func(n int, req protocol.Message) response {
		if n == 2 {
			return response{hangUp: true}
		}
		return answer(n, req)
	})
	c := dial(t, p.addr(), client.WithSubmitRetries(5, time.Millisecond, time.Millisecond))
	ctx := context.Background()
	if _, err := c.Status(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	_, err := c.Submit(ctx, "SHA256", map[string]string{"text": ""})
	if err == nil || errors.Is(err, client.ErrNoCoordinator) || errors.Is(err, client.ErrRejected) ||
		!strings.Contains(err.Error(), "broken") {
		t.Fatalf("Submit on a broken connection = %v, want a broken-connection error", err)
	}
	if got := p.requests.Load(); got != 2 {
		t.Fatalf("%d requests, want 2: a broken submission is never resent", got)
	}
	if job, err := c.Status(ctx, "b"); err != nil || job.JobID != "b" {
		t.Fatalf("Status after the break = %+v, %v", job, err)
	}
	if got := p.accepts.Load(); got != 2 {
		t.Fatalf("%d connections, want 2 (one redial)", got)
	}
}

func TestTCPNoBridge(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	_, err := client.DialTCP(context.Background(), addr)
	if !errors.Is(err, client.ErrNoCoordinator) {
		t.Fatalf("DialTCP = %v, want ErrNoCoordinator", err)
	}
	want := fmt.Sprintf("no jobbus bridge answered on %s (is `jobbus serve` running?)", addr)
	if err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

// TestTCPBridgeGoesAway: a request in flight when the bridge leaves fails as broken,
// and the next request, dialling again, finds no bridge. A bridge that leaves while
// the connection is idle is noticed by the connection's reader, so the first request
// after it may already find no bridge (or race the reader to the old connection and
// fail as broken); the one after that finds no bridge.
func TestTCPBridgeGoesAway(t *testing.T) {
	t.Parallel()
	for _, inFlight := range []bool{true, false} {
		t.Run(fmt.Sprint("inFlight=", inFlight), func(t *testing.T) {
			t.Parallel()
			p := newBridgePeer(t, func(n int, req protocol.Message) response {
				if n == 2 {
					return response{silent: true}
				}
				return answer(n, req)
			})
			c := dial(t, p.addr())
			ctx := context.Background()
			if _, err := c.Workers(ctx); err != nil {
				t.Fatal(err)
			}
			if inFlight {
				go func() {
					<-p.got // the first request's
					<-p.got // the second is in flight
					p.close()
				}()
				if _, err := c.Workers(ctx); err == nil || errors.Is(err, client.ErrNoCoordinator) ||
					!strings.Contains(err.Error(), "broken, outcome unknown") {
					t.Fatalf("request in flight as the bridge left = %v, want a broken-connection error", err)
				}
			} else {
				p.close()
				if _, err := c.Workers(ctx); !errors.Is(err, client.ErrNoCoordinator) &&
					(err == nil || !strings.Contains(err.Error(), "broken, outcome unknown")) {
					t.Fatalf("request after the bridge left = %v, want ErrNoCoordinator or a broken-connection error", err)
				}
			}
			if _, err := c.Workers(ctx); !errors.Is(err, client.ErrNoCoordinator) {
				t.Fatalf("request after the bridge left = %v, want ErrNoCoordinator", err)
			}
		})
	}
}

// TestTCPContextDeadline: a request whose ctx ends before its reply fails with ctx's
// error; its reply, when it comes, is discarded, and the next request on the same
// connection gets its own reply. (The transport used to drop the connection here.)
func TestTCPContextDeadline(t *testing.T) {
	t.Parallel()
	late := make(chan struct{})
	p := newBridgePeer(t, func(n int, req protocol.Message) response {
		if n == 1 {
			select { // answer once the request's ctx has ended
			case <-late:
			case <-time.After(waitLimit):
			}
		}
		return answer(n, req)
	})
	c := dial(t, p.addr())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Status(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Status with no reply = %v, want context.DeadlineExceeded", err)
	}
	close(late)
	// The late reply must not be taken for the next request's.
	if job, err := c.Status(context.Background(), "b"); err != nil || job.JobID != "b" {
		t.Fatalf("Status after a timeout = %+v, %v", job, err)
	}
	if got := p.accepts.Load(); got != 1 {
		t.Fatalf("%d connections, want 1: a ctx that ends costs no connection", got)
	}
}

func TestTCPClientTimeout(t *testing.T) {
	t.Parallel()
	p := newBridgePeer(t, func(int, protocol.Message) response { return response{silent: true} })
	c := dial(t, p.addr(), client.WithTimeout(100*time.Millisecond))
	if _, err := c.Status(context.Background(), "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Status with no reply = %v, want the client's timeout", err)
	}
}

func TestTCPContextCancel(t *testing.T) {
	t.Parallel()
	p := newBridgePeer(t, func(int, protocol.Message) response { return response{silent: true} })
	c := dial(t, p.addr())
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-p.got // the request is out
		cancel()
	}()
	if _, err := c.Status(ctx, "a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Status = %v, want context.Canceled", err)
	}
}

func TestTCPClose(t *testing.T) {
	t.Parallel()
	p := newBridgePeer(t, func(int, protocol.Message) response { return response{silent: true} })
	c := dial(t, p.addr())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Status(context.Background(), "a")
		errc <- err
	}()
	<-p.got // in flight
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, client.ErrClosed) {
			t.Fatalf("request interrupted by Close = %v, want ErrClosed", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Close did not interrupt the request in flight")
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Status(context.Background(), "b"); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("request after Close = %v, want ErrClosed", err)
	}
	if got := p.accepts.Load(); got != 1 {
		t.Fatalf("%d connections, want 1: a closed client does not redial", got)
	}
}

func TestTCPRefusesWhatItCannotSend(t *testing.T) {
	t.Parallel()
	p := newBridgePeer(t, answer)
	c := dial(t, p.addr())
	ctx := context.Background()
	if _, err := c.DoRaw(ctx, protocol.TypeHeartbeat, []byte(`{"type":"HEARTBEAT","workerId":"w"}`)); err == nil {
		t.Fatal("DoRaw sent a worker-port message")
	}
	big := json.RawMessage(`{"text":"` + strings.Repeat("x", frame.MaxSize) + `"}`)
	if _, err := c.Submit(ctx, "SHA256", big); !errors.Is(err, frame.ErrTooLarge) {
		t.Fatalf("Submit of a body over 1 MiB = %v, want frame.ErrTooLarge", err)
	}
	if _, err := c.Status(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got, accepts := p.requests.Load(), p.accepts.Load(); got != 1 || accepts != 1 {
		t.Fatalf("%d requests on %d connections, want 1 on 1", got, accepts)
	}
}

func TestTCPMalformedReply(t *testing.T) {
	t.Parallel()
	p := newBridgePeer(t, func(int, protocol.Message) response { return response{raw: []byte("not json")} })
	c := dial(t, p.addr())
	if _, err := c.Status(context.Background(), "a"); !errors.Is(err, protocol.ErrMalformed) {
		t.Fatalf("Status = %v, want protocol.ErrMalformed", err)
	}
}

// TestTCPWorkerPort: an address that answers a client request as the worker port
// answers an unregistered worker is reported as the wrong port, whatever the request.
func TestTCPWorkerPort(t *testing.T) {
	t.Parallel()
	p := newBridgePeer(t, func(int, protocol.Message) response {
		return response{reply: protocol.FirstMessageMustRegister()}
	})
	c, err := client.DialTCP(context.Background(), p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 2 { // the connection the port closed is dialled again, and judged again
		_, err := c.Status(context.Background(), "some-id")
		if !errors.Is(err, client.ErrWorkerPort) {
			t.Fatalf("Status = %v, want ErrWorkerPort", err)
		}
		want := p.addr() + ` is a worker port (it answered "First message must be WORKER_REGISTER"); clients use the bridge's client port (7071 by default)`
		if err.Error() != want {
			t.Fatalf("error %q, want %q", err, want)
		}
	}
}

// TestTCPContextEndsWithTheReply: a request's ctx that ends as its reply arrives must
// not fail the next request on the connection (its expired deadline is cleared). The
// peer cancels the request's ctx just before it answers, so the expiry lands before,
// during or after the reply is read; every request after it succeeds.
func TestTCPContextEndsWithTheReply(t *testing.T) {
	t.Parallel()
	cancels := make(chan context.CancelFunc, 1)
	p := newBridgePeer(t, func(n int, req protocol.Message) response {
		select {
		case cancel := <-cancels:
			cancel()
		default:
		}
		return answer(n, req)
	})
	c := dial(t, p.addr())
	for i := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels <- cancel
		if _, err := c.Status(ctx, "a"); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: Status = %v, want a reply or context.Canceled", i, err)
		}
		cancel()
		if job, err := c.Status(context.Background(), "b"); err != nil || job.JobID != "b" {
			t.Fatalf("round %d: Status after a ctx that ended = %+v, %v", i, job, err)
		}
	}
}
