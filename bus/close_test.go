package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestAsksQueuedAtAClosingNodeFailFast: asks that reached a node but wait for a handler
// slot when it closes are answered at once with CodeUnavailable, not left to their
// timeout.
func TestAsksQueuedAtAClosingNodeFailFast(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"), bus.WithAskTimeout(time.Minute))
	w := connect(t, s.url, worker("w1"), bus.WithMaxInFlight(1))
	entered := make(chan struct{}, 1)
	must(t, w.Handle("stuck", func(ctx context.Context, _ *bus.Request) (any, error) {
		entered <- struct{}{}
		<-ctx.Done()
		return nil, bus.WithCode(bus.CodeUnavailable, ctx.Err())
	}))
	// A probe on w's connection: once it arrives, so have the asks sent before it.
	probe := make(chan *nats.Msg, 1)
	sub, err := w.Conn().ChanSubscribe("probe.w1", probe)
	must(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	must(t, w.Conn().Flush())

	const asks = 3
	errs := make(chan error, asks)
	for range asks {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := bus.Ask[json.RawMessage](ctx, c, w.Self(), "stuck", nil)
			errs <- err
		}()
	}
	recv(t, "handler entered", entered)
	testkit.Eventually(t, 10*time.Second, "every ask sent", func() bool { return c.Stats().Sent.Ask == asks })
	must(t, c.Conn().Publish("probe.w1", nil))
	recv(t, "probe", probe)

	start := time.Now()
	must(t, w.Close())
	for range asks {
		err := recv(t, "an ask to end", errs)
		if !errors.Is(err, bus.CodeUnavailable) {
			t.Fatalf("ask at a closing node: %v, want CodeUnavailable", err)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("asks at a closing node failed after %v", took)
	}
}

// TestAsksQueuedAtAnUnhandledPathFailFast: asks that reached a node but wait for a
// handler slot when the node stops serving their path (Unhandle, UnhandleAny) are
// answered at once with CodeUnavailable, not left to their timeout; the handler already
// running finishes and answers.
func TestAsksQueuedAtAnUnhandledPathFailFast(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		handle    func(*bus.Node, bus.HandlerFunc) error
		unhandle  func(*bus.Node) error
		stillOwns string // a path with a handler of its own, which keeps serving
	}{
		{"Unhandle", func(n *bus.Node, fn bus.HandlerFunc) error { return n.Handle("stuck", fn) },
			func(n *bus.Node) error { return n.Unhandle("stuck") }, ""},
		{"UnhandleAny", func(n *bus.Node, fn bus.HandlerFunc) error { return n.HandleAny(fn) },
			(*bus.Node).UnhandleAny, "own"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startServer(t, -1)
			c := connect(t, s.url, coordinator("c1"), bus.WithAskTimeout(time.Minute))
			w := connect(t, s.url, worker("w1"), bus.WithMaxInFlight(1))
			entered := make(chan struct{}, 1)
			release := make(chan struct{})
			must(t, tc.handle(w, func(ctx context.Context, _ *bus.Request) (any, error) {
				entered <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done(): // the test failed, and w closes
				}
				return "done", nil
			}))
			if tc.stillOwns != "" {
				whoAmI(t, w, tc.stillOwns)
			}
			probe := make(chan *nats.Msg, 1)
			sub, err := w.Conn().ChanSubscribe("probe.w1", probe)
			must(t, err)
			defer func() { _ = sub.Unsubscribe() }()
			must(t, w.Conn().Flush())

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			first := make(chan error, 1)
			go func() {
				_, err := bus.Ask[string](ctx, c, w.Self(), "stuck", nil)
				first <- err
			}()
			recv(t, "handler entered", entered)
			const queued = 3
			errs := make(chan error, queued)
			for range queued {
				go func() {
					_, err := bus.Ask[json.RawMessage](ctx, c, w.Self(), "stuck", nil)
					errs <- err
				}()
			}
			testkit.Eventually(t, 10*time.Second, "every ask sent", func() bool { return c.Stats().Sent.Ask == queued+1 })
			must(t, c.Conn().Publish("probe.w1", nil))
			recv(t, "probe", probe)

			start := time.Now()
			must(t, tc.unhandle(w))
			for range queued {
				select {
				case err := <-errs:
					if !errors.Is(err, bus.CodeUnavailable) {
						t.Fatalf("ask queued at an unhandled path: %v, want CodeUnavailable", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("asks queued at an unhandled path still wait %v after %s", time.Since(start), tc.name)
				}
			}
			close(release)
			if err := recv(t, "the running handler's answer", first); err != nil {
				t.Fatalf("the handler running at %s: %v, want its answer", tc.name, err)
			}
			if tc.stillOwns != "" {
				if _, err := bus.Ask[echo](ctx, c, w.Self(), tc.stillOwns, nil); err != nil {
					t.Fatalf("a path with its own handler after %s: %v", tc.name, err)
				}
			}
			if _, err := bus.Ask[string](ctx, c, w.Self(), "stuck", nil); !errors.Is(err, bus.ErrNoPeer) {
				t.Fatalf("ask after %s: %v, want ErrNoPeer", tc.name, err)
			}
		})
	}
}

// TestCloseOnAStalledServerWaitsOneAskTimeout: when the server stops answering (frozen,
// its connection still up), Close gives the drain of all its handlers one ask timeout,
// not one per path.
func TestCloseOnAStalledServerWaitsOneAskTimeout(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	p := newStallProxy(t, fmt.Sprintf("127.0.0.1:%d", s.port))
	const askTimeout, paths = time.Second, 10
	w := connect(t, "nats://"+p.addr(), worker("w1"), bus.WithAskTimeout(askTimeout))
	for i := range paths {
		must(t, w.Handle(fmt.Sprintf("p%d", i), func(context.Context, *bus.Request) (any, error) { return nil, nil }, bus.AsRole()))
	}
	p.stall()
	start := time.Now()
	must(t, w.Close())
	// One ask timeout and the connection's close; one per path would be paths of them.
	if took := time.Since(start); took > paths/2*askTimeout {
		t.Fatalf("Close on a stalled server took %v, with an ask timeout of %v", took, askTimeout)
	}
}

// stallProxy forwards TCP to a server until stall, and from then on passes nothing
// either way while keeping the connections open, as a frozen server (SIGSTOP, a stalled
// VM) looks to its clients until their pings time out.
type stallProxy struct {
	ln      net.Listener
	target  string
	stalled chan struct{}
	mu      sync.Mutex
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	p := &stallProxy{ln: ln, target: target, stalled: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }
func (p *stallProxy) stall()       { close(p.stalled) }

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

// pipe copies src to dst until the proxy stalls, then reads src and drops it (the
// frozen peer's socket buffer), until either side closes.
func (p *stallProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.stalled:
		default:
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
