package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestAskMatrix covers Mu's communication matrix: every direction between workers and
// coordinators, each node on its own outbound connection.
func TestAskMatrix(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c1 := connect(t, s.url, coordinator("c1"))
	c2 := connect(t, s.url, coordinator("c2"))
	w1 := connect(t, s.url, worker("w1"))
	w2 := connect(t, s.url, worker("w2"))
	for _, n := range []*bus.Node{c1, c2, w1, w2} {
		whoAmI(t, n, "who", bus.AsRole())
	}
	tests := []struct {
		name     string
		from     *bus.Node
		to       bus.Address
		answerer []string // who may answer
	}{
		{"WorkerToCoordinatorRole", w1, anyOf(bus.RoleCoordinator), []string{"coordinator/c1", "coordinator/c2"}},
		{"WorkerToCoordinator", w1, coordinator("c2"), []string{"coordinator/c2"}},
		{"CoordinatorToWorker", c1, worker("w2"), []string{"worker/w2"}},
		{"CoordinatorToWorkerRole", c1, anyOf(bus.RoleWorker), []string{"worker/w1", "worker/w2"}},
		{"WorkerToWorker", w1, worker("w2"), []string{"worker/w2"}},
		{"CoordinatorToCoordinator", c2, coordinator("c1"), []string{"coordinator/c1"}},
		{"ToSelf", w1, worker("w1"), []string{"worker/w1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := bus.Ask[echo](context.Background(), tt.from, tt.to, "who", nil)
			if err != nil {
				t.Fatal(err)
			}
			if !contains(tt.answerer, got.Me) {
				t.Errorf("answered by %s, want one of %v", got.Me, tt.answerer)
			}
			if got.From != tt.from.Self().String() {
				t.Errorf("answerer saw sender %s, want %s", got.From, tt.from.Self())
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestAskRoleIsLoadBalanced: asks to "any coordinator" reach both coordinators, each
// ask exactly one of them.
func TestAskRoleIsLoadBalanced(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	w := connect(t, s.url, worker("w1"))
	var served [2]atomic.Int64
	for i := range served {
		c := connect(t, s.url, coordinator(fmt.Sprintf("c%d", i)))
		err := c.Handle("worker.register", func(context.Context, *bus.Request) (any, error) {
			served[i].Add(1)
			return nil, nil
		}, bus.OnlyRole())
		if err != nil {
			t.Fatal(err)
		}
	}
	const asks = 200
	for range asks {
		if _, err := bus.Ask[json.RawMessage](context.Background(), w, anyOf(bus.RoleCoordinator), "worker.register", nil); err != nil {
			t.Fatal(err)
		}
	}
	a, b := served[0].Load(), served[1].Load()
	if a+b != asks || a == 0 || b == 0 {
		t.Fatalf("coordinators served %d and %d of %d asks; want all, spread over both", a, b, asks)
	}
	// OnlyRole: the coordinators' own subjects are not served.
	_, err := bus.Ask[json.RawMessage](context.Background(), w, coordinator("c0"), "worker.register", nil)
	if !errors.Is(err, bus.ErrNoPeer) {
		t.Fatalf("direct ask to an OnlyRole handler: %v, want ErrNoPeer", err)
	}
}

// TestTellReachesWorkerOverItsOwnConnection: the coordinator reaches the worker through
// the subscription the worker made on its outbound connection.
func TestTellReachesWorkerOverItsOwnConnection(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"))
	w := connect(t, s.url, worker("worker-1a2b3c4d"))
	type assign struct {
		JobID string `json:"jobId"`
	}
	got := make(chan assign, 1)
	from := make(chan bus.Address, 1)
	err := bus.Handle(w, "task.assign", func(_ context.Context, f bus.Address, a assign) (struct{}, error) {
		from <- f
		got <- a
		return struct{}{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Tell(context.Background(), w.Self(), "task.assign", assign{JobID: "j1"}); err != nil {
		t.Fatal(err)
	}
	if a := recv(t, "assign", got); a.JobID != "j1" {
		t.Fatalf("got %+v", a)
	}
	if f := recv(t, "sender", from); f != c.Self() {
		t.Fatalf("from %v, want %v", f, c.Self())
	}
}

func TestHandlerErrorComesBackAsRemoteError(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"))
	w := connect(t, s.url, worker("w1"))
	must(t, w.Handle("fails", func(context.Context, *bus.Request) (any, error) {
		return "ignored", errors.New("Unknown job: j-42")
	}))
	must(t, w.Handle("forgets", func(context.Context, *bus.Request) (any, error) {
		return nil, bus.Errorf(bus.CodeNotFound, "unknown worker %s", "w9")
	}))
	must(t, w.Handle("refuses", func(context.Context, *bus.Request) (any, error) {
		err := bus.Errorf(bus.CodeForbidden, "worker %s may not speak for %s", "w1", "w2")
		if !errors.Is(err, bus.CodeForbidden) || errors.Is(err, bus.CodeBadRequest) {
			t.Errorf("the handler's coded error %v is not CodeForbidden to errors.Is", err)
		}
		return nil, fmt.Errorf("wrapped: %w", err)
	}))
	must(t, w.Handle("panics", func(context.Context, *bus.Request) (any, error) {
		panic("kaboom")
	}))
	must(t, bus.Handle(w, "typed", func(_ context.Context, _ bus.Address, n int) (int, error) { return n * 2, nil }))

	tests := []struct {
		name, path string
		req        any
		want       string
		code       bus.Code
	}{
		{"Error", "fails", nil, "Unknown job: j-42", bus.CodeInternal},
		{"CodedError", "forgets", nil, "unknown worker w9", bus.CodeNotFound},
		{"Forbidden", "refuses", nil, "wrapped: worker w1 may not speak for w2", bus.CodeForbidden},
		{"Panic", "panics", nil, "handler panics panicked: kaboom", bus.CodeInternal},
		{"UndecodableRequest", "typed", "not a number", "decode typed request", bus.CodeBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := bus.Ask[json.RawMessage](context.Background(), c, w.Self(), tt.path, tt.req)
			var re *bus.RemoteError
			if !errors.Is(err, bus.ErrRemote) || !errors.As(err, &re) {
				t.Fatalf("err = %v, want a RemoteError", err)
			}
			if !strings.Contains(re.Message, tt.want) || err.Error() != re.Message || re.Path != tt.path {
				t.Fatalf("RemoteError %+v (Error() %q), want message containing %q", re, err.Error(), tt.want)
			}
			if re.Code != tt.code || !errors.Is(err, tt.code) {
				t.Fatalf("code %d, want %d", re.Code, tt.code)
			}
			for _, other := range []bus.Code{bus.CodeBadRequest, bus.CodeForbidden, bus.CodeNotFound, bus.CodeInternal, bus.CodeUnavailable} {
				if other != tt.code && errors.Is(err, other) {
					t.Fatalf("errors.Is(err, %d) holds for code %d", other, tt.code)
				}
			}
		})
	}
	if got, err := bus.Ask[int](context.Background(), c, w.Self(), "typed", 21); err != nil || got != 42 {
		t.Fatalf("typed ask = %d, %v", got, err)
	}
	st := w.Stats()
	if st.HandlerPanics != 1 || st.HandlerErrors < 5 {
		t.Fatalf("stats: %d panics, %d errors; want 1 and >= 5", st.HandlerPanics, st.HandlerErrors)
	}
	if cs := c.Stats(); cs.Asks.RemoteError != 5 || cs.Asks.OK != 1 {
		t.Fatalf("asker stats %+v", cs.Asks)
	}
}

func TestAskToAbsentNodeFailsFastWithNoPeer(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	const timeout = 4 * time.Second
	c := connect(t, s.url, coordinator("c1"), bus.WithAskTimeout(timeout))
	w := connect(t, s.url, worker("w1"))
	whoAmI(t, w, "who")
	for _, to := range []bus.Address{worker("nobody"), anyOf(bus.RoleBridge), worker("w1")} {
		path := "who"
		if to == w.Self() {
			path = "unhandled" // a node that is there, a path it does not serve
		}
		start := time.Now()
		_, err := bus.Ask[echo](context.Background(), c, to, path, nil)
		if !errors.Is(err, bus.ErrNoPeer) {
			t.Fatalf("ask %s %s: %v, want ErrNoPeer", to, path, err)
		}
		if elapsed := time.Since(start); elapsed > timeout/2 {
			t.Fatalf("ask %s took %v; no-responders should answer long before the %v timeout", to, elapsed, timeout)
		}
	}
	if st := c.Stats(); st.Asks.NoPeer != 3 {
		t.Fatalf("NoPeer counted %d, want 3", st.Asks.NoPeer)
	}
}

func TestAskTimesOut(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"), bus.WithAskTimeout(50*time.Millisecond))
	w := connect(t, s.url, worker("w1"))
	must(t, w.Handle("stuck", func(ctx context.Context, _ *bus.Request) (any, error) {
		<-ctx.Done() // until the worker closes
		return nil, ctx.Err()
	}))
	canceled, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	tests := []struct {
		name    string
		timeout time.Duration // of the ask's context; 0: none, the node's ask timeout holds
		cause   error
	}{
		{"ContextDeadline", 50 * time.Millisecond, context.DeadlineExceeded},
		{"NodeAskTimeout", 0, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Made here, not before the subtests: a loaded machine could let a shared
			// deadline pass before the ask starts.
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			_, err := bus.Ask[json.RawMessage](ctx, c, w.Self(), "stuck", nil)
			if !errors.Is(err, bus.ErrTimeout) || !errors.Is(err, tt.cause) {
				t.Fatalf("err = %v, want ErrTimeout wrapping %v", err, tt.cause)
			}
		})
	}
	if _, err := bus.Ask[json.RawMessage](canceled, c, w.Self(), "stuck", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("ask with a done context: %v", err)
	}
	if st := c.Stats(); st.Asks.Timeout != 2 {
		t.Fatalf("timeouts counted %d, want 2", st.Asks.Timeout)
	}
}

// TestPendingAskFailsWhenServerGoes: an ask in flight fails at once with ErrDisconnected
// when the connection drops; after the server is back, asks work again.
func TestPendingAskFailsWhenServerGoes(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"), bus.WithAskTimeout(time.Minute))
	w := connect(t, s.url, worker("w1"))
	entered := make(chan struct{}, 1)
	must(t, w.Handle("stuck", func(ctx context.Context, _ *bus.Request) (any, error) {
		entered <- struct{}{}
		<-ctx.Done()
		return nil, nil
	}))
	whoAmI(t, w, "who")
	errc := make(chan error, 1)
	go func() {
		_, err := bus.Ask[json.RawMessage](context.Background(), c, w.Self(), "stuck", nil)
		errc <- err
	}()
	recv(t, "handler entered", entered)
	stopServer(s.srv)
	if err := recv(t, "ask to fail", errc); !errors.Is(err, bus.ErrDisconnected) {
		t.Fatalf("pending ask: %v, want ErrDisconnected", err)
	}
	if _, err := bus.Ask[echo](context.Background(), c, w.Self(), "who", nil); !errors.Is(err, bus.ErrDisconnected) {
		t.Fatalf("ask while down: %v, want ErrDisconnected", err)
	}

	startServer(t, s.port)
	testkit.Eventually(t, 10*time.Second, "asks to work after reconnect", func() bool {
		_, err := bus.Ask[echo](context.Background(), c, w.Self(), "who", nil)
		return err == nil
	})
	st := c.Stats()
	if st.Disconnects != 1 || st.Reconnects != 1 || st.Asks.Disconnected < 2 {
		t.Fatalf("stats: %d disconnects, %d reconnects, %d disconnected asks", st.Disconnects, st.Reconnects, st.Asks.Disconnected)
	}
}

// TestConnectBeforeServerStarts: start-up does not depend on the network.
func TestConnectBeforeServerStarts(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	c := connect(t, url, coordinator("c1"))
	w := connect(t, url, worker("w1"))
	whoAmI(t, c, "who", bus.AsRole()) // subscribed before any server exists

	if _, err := bus.Ask[echo](context.Background(), w, anyOf(bus.RoleCoordinator), "who", nil); !errors.Is(err, bus.ErrDisconnected) {
		t.Fatalf("ask without a server: %v, want ErrDisconnected", err)
	}
	if err := w.Tell(context.Background(), c.Self(), "who", nil); !errors.Is(err, bus.ErrDisconnected) || strings.Contains(err.Error(), "headers") {
		t.Fatalf("tell without a server: %v, want ErrDisconnected, and no word of headers", err)
	}

	startServer(t, port)
	var got echo
	testkit.Eventually(t, 10*time.Second, "ask to work once the server is up", func() bool {
		var err error
		got, err = bus.Ask[echo](context.Background(), w, anyOf(bus.RoleCoordinator), "who", nil)
		return err == nil
	})
	if got.Me != "coordinator/c1" || got.From != "worker/w1" {
		t.Fatalf("answer %+v", got)
	}
	if st := w.Stats(); st.Reconnects != 0 || st.Disconnects != 0 {
		t.Fatalf("first connection counted as %d reconnects, %d disconnects", st.Reconnects, st.Disconnects)
	}
}

func TestUnsafeIDsRoundTrip(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	ids := []string{"a.b", "*", ">", "with space", "ünïcødé", "x/y", "~", "a.*.>"}
	nodes := make([]*bus.Node, len(ids))
	for i, id := range ids {
		nodes[i] = connect(t, s.url, worker(id))
		whoAmI(t, nodes[i], "who")
	}
	for i, id := range ids {
		asker := nodes[(i+1)%len(nodes)]
		got, err := bus.Ask[echo](context.Background(), asker, worker(id), "who", nil)
		if err != nil {
			t.Fatalf("ask %q: %v", id, err)
		}
		me, err := bus.ParseAddress(got.Me)
		if err != nil || me.ID != id {
			t.Fatalf("ask %q answered by %q (%v)", id, got.Me, err)
		}
		from, err := bus.ParseAddress(got.From)
		if err != nil || from != asker.Self() {
			t.Fatalf("answerer of %q saw sender %q, want %v", id, got.From, asker.Self())
		}
	}
	// "*" is an id, not a wildcard: a node called "*" does not receive other nodes' messages.
	if _, err := bus.Ask[echo](context.Background(), nodes[0], worker("nobody"), "who", nil); !errors.Is(err, bus.ErrNoPeer) {
		t.Fatalf("ask to an absent node beside wildcard-like ids: %v, want ErrNoPeer", err)
	}
}

func TestStatsCountTraffic(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"))
	w := connect(t, s.url, worker("w1"))
	var tells atomic.Int64
	must(t, w.Handle("note", func(context.Context, *bus.Request) (any, error) { tells.Add(1); return nil, nil }))
	must(t, w.Handle("echo", func(_ context.Context, r *bus.Request) (any, error) { return r.Data, nil }))
	payload := []byte(`{"hello":"world"}`) // 17 bytes
	for range 3 {
		must(t, c.Tell(context.Background(), w.Self(), "note", payload))
	}
	for range 4 {
		got, err := bus.Ask[[]byte](context.Background(), c, w.Self(), "echo", payload)
		if err != nil || string(got) != string(payload) {
			t.Fatalf("echo = %q, %v", got, err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "tells handled", func() bool { return tells.Load() == 3 })

	// The handler counts a response once it is sent, which may be just after the asker
	// has it.
	testkit.Eventually(t, 10*time.Second, "responses counted", func() bool { return w.Stats().Sent.Response == 4 })
	cs, ws := c.Stats(), w.Stats()
	if cs.Sent.Tell != 3 || cs.Sent.Ask != 4 || cs.Received.Response != 4 || cs.BytesSent != 7*17 || cs.BytesReceived != 4*17 {
		t.Errorf("asker stats: sent %+v received %+v bytes %d/%d", cs.Sent, cs.Received, cs.BytesSent, cs.BytesReceived)
	}
	if ws.Received.Tell != 3 || ws.Received.Ask != 4 || ws.Sent.Response != 4 || ws.BytesReceived != 7*17 {
		t.Errorf("handler stats: sent %+v received %+v bytes %d", ws.Sent, ws.Received, ws.BytesReceived)
	}
	if cs.Asks.OK != 4 {
		t.Errorf("asks OK = %d, want 4", cs.Asks.OK)
	}
	var observed uint64
	for _, b := range cs.AskLatency {
		observed += b.Count
	}
	if observed != 4 || cs.AskLatency[len(cs.AskLatency)-1].UpTo != 0 || cs.AskLatency[0].UpTo != 50*time.Microsecond {
		t.Errorf("latency histogram %+v, want 4 observations", cs.AskLatency)
	}
}

// TestNodesSharingAConn: the bridge's case, several nodes on one connection.
func TestNodesSharingAConn(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	nc := dial(t, s.url)
	c := connect(t, s.url, coordinator("c1"))
	var nodes [2]*bus.Node
	for i := range nodes {
		n, err := bus.New(nc, worker(fmt.Sprintf("tcp-%d", i)), bus.WithLogger(quiet()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		whoAmI(t, n, "who")
		nodes[i] = n
	}
	// Each node gets its own messages and its own answers.
	for _, n := range nodes {
		got, err := bus.Ask[echo](context.Background(), c, n.Self(), "who", nil)
		if err != nil || got.Me != n.Self().String() {
			t.Fatalf("ask %s: %+v, %v", n.Self(), got, err)
		}
		got, err = bus.Ask[echo](context.Background(), n, c.Self(), "who", nil)
		if !errors.Is(err, bus.ErrNoPeer) {
			t.Fatalf("ask from %s to a coordinator without handler: %+v, %v", n.Self(), got, err)
		}
	}
	whoAmI(t, c, "who")
	for _, n := range nodes {
		got, err := bus.Ask[echo](context.Background(), n, c.Self(), "who", nil)
		if err != nil || got.From != n.Self().String() {
			t.Fatalf("ask from %s: %+v, %v", n.Self(), got, err)
		}
	}

	must(t, nodes[0].Close())
	if nc.IsClosed() {
		t.Fatal("closing a node closed the shared connection")
	}
	if _, err := bus.Ask[echo](context.Background(), c, nodes[0].Self(), "who", nil); !errors.Is(err, bus.ErrNoPeer) {
		t.Fatalf("ask to the closed node: %v, want ErrNoPeer", err)
	}
	if got, err := bus.Ask[echo](context.Background(), c, nodes[1].Self(), "who", nil); err != nil || got.Me != nodes[1].Self().String() {
		t.Fatalf("ask to the remaining node: %+v, %v", got, err)
	}
	if _, err := bus.Ask[echo](context.Background(), nodes[1], c.Self(), "who", nil); err != nil {
		t.Fatalf("ask from the remaining node: %v", err)
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"), bus.WithAskTimeout(time.Minute))
	w := connect(t, s.url, worker("w1"))
	entered := make(chan struct{}, 1)
	must(t, w.Handle("stuck", func(ctx context.Context, _ *bus.Request) (any, error) {
		entered <- struct{}{}
		<-ctx.Done()
		return nil, nil
	}))
	errc := make(chan error, 1)
	go func() {
		_, err := bus.Ask[json.RawMessage](context.Background(), c, w.Self(), "stuck", nil)
		errc <- err
	}()
	recv(t, "handler entered", entered)
	must(t, c.Close())
	if err := recv(t, "pending ask", errc); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("pending ask on close: %v, want ErrClosed", err)
	}
	must(t, c.Close()) // idempotent
	if _, err := bus.Ask[json.RawMessage](context.Background(), c, w.Self(), "stuck", nil); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("ask after close: %v", err)
	}
	if err := c.Tell(context.Background(), w.Self(), "stuck", nil); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("tell after close: %v", err)
	}
	if err := c.Handle("x", func(context.Context, *bus.Request) (any, error) { return nil, nil }); !errors.Is(err, bus.ErrClosed) {
		t.Fatalf("handle after close: %v", err)
	}
	if !c.Conn().IsClosed() {
		t.Fatal("Close left the node's own connection open")
	}
	// The worker closes with its handler running: Close ends the handler's context and waits.
	must(t, w.Close())
}

func TestHandleUnhandle(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"))
	w := connect(t, s.url, worker("w1"))
	whoAmI(t, w, "who", bus.AsRole())
	if err := w.Handle("who", func(context.Context, *bus.Request) (any, error) { return nil, nil }); !errors.Is(err, bus.ErrHandled) {
		t.Fatalf("second handler: %v, want ErrHandled", err)
	}
	for _, p := range []string{"", "a..b", ".a", "a.", "a.*", "a.>", "a b", "a\tb"} {
		if err := w.Handle(p, func(context.Context, *bus.Request) (any, error) { return nil, nil }); !errors.Is(err, bus.ErrInvalidPath) {
			t.Errorf("Handle(%q): %v, want ErrInvalidPath", p, err)
		}
		if err := c.Tell(context.Background(), w.Self(), p, nil); !errors.Is(err, bus.ErrInvalidPath) {
			t.Errorf("Tell(%q): %v, want ErrInvalidPath", p, err)
		}
	}
	must(t, w.Unhandle("who"))
	must(t, w.Unhandle("who"))
	for _, to := range []bus.Address{w.Self(), anyOf(bus.RoleWorker)} {
		if _, err := bus.Ask[echo](context.Background(), c, to, "who", nil); !errors.Is(err, bus.ErrNoPeer) {
			t.Fatalf("ask %s after Unhandle: %v, want ErrNoPeer", to, err)
		}
	}
	whoAmI(t, w, "who")
	if _, err := bus.Ask[echo](context.Background(), c, w.Self(), "who", nil); err != nil {
		t.Fatalf("ask after handling again: %v", err)
	}
}

// TestHandlersRunConcurrentlyWithinABound: a slow handler does not hold up others, and
// no more than WithMaxInFlight handlers run at once.
func TestHandlersRunConcurrentlyWithinABound(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"))
	const limit = 3
	w := connect(t, s.url, worker("w1"), bus.WithMaxInFlight(limit))
	release := make(chan struct{})
	var running, peak, done atomic.Int64
	must(t, w.Handle("slow", func(context.Context, *bus.Request) (any, error) {
		r := running.Add(1)
		for p := peak.Load(); r > p && !peak.CompareAndSwap(p, r); p = peak.Load() {
		}
		<-release
		running.Add(-1)
		done.Add(1)
		return nil, nil
	}))
	whoAmI(t, w, "who")

	// One slow handler running: another path still answers.
	must(t, c.Tell(context.Background(), w.Self(), "slow", nil))
	testkit.Eventually(t, 10*time.Second, "slow handler to start", func() bool { return running.Load() == 1 })
	if _, err := bus.Ask[echo](context.Background(), c, w.Self(), "who", nil); err != nil {
		t.Fatalf("ask beside a slow handler: %v", err)
	}

	const tells = 20
	for range tells - 1 {
		must(t, c.Tell(context.Background(), w.Self(), "slow", nil))
	}
	// A slot is taken before its handler runs: wait for the handlers themselves.
	testkit.Eventually(t, 10*time.Second, "the bound to fill", func() bool { return running.Load() == limit && w.Stats().InFlight == limit })
	close(release)
	testkit.Eventually(t, 10*time.Second, "every tell handled", func() bool { return done.Load() == tells })
	if p := peak.Load(); p != limit {
		t.Fatalf("peak concurrency %d, want %d", p, limit)
	}
}

// TestOwnSlotsKeepAPathFromTakingTheNodesSlots: a path with slots of its own runs at
// most that many handlers, and however many of them wait, the node's other paths are
// answered; its running handlers count in the node's InFlight.
func TestOwnSlotsKeepAPathFromTakingTheNodesSlots(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"))
	const shared, own = 2, 3
	w := connect(t, s.url, worker("w1"), bus.WithMaxInFlight(shared))
	release := make(chan struct{})
	var running, peak, done atomic.Int64
	must(t, w.Handle("slow", func(ctx context.Context, _ *bus.Request) (any, error) {
		r := running.Add(1)
		for p := peak.Load(); r > p && !peak.CompareAndSwap(p, r); p = peak.Load() {
		}
		select {
		case <-release:
		case <-ctx.Done(): // the test failed: Close must not wait for release
		}
		running.Add(-1)
		done.Add(1)
		return nil, nil
	}, bus.OwnSlots(own)))
	whoAmI(t, w, "who")

	const tells = 10
	for range tells {
		must(t, c.Tell(context.Background(), w.Self(), "slow", nil))
	}
	testkit.Eventually(t, 10*time.Second, "the path's own bound to fill", func() bool { return running.Load() == own && w.Stats().InFlight == own })
	for range shared + 1 {
		if _, err := bus.Ask[echo](context.Background(), c, w.Self(), "who", nil); err != nil {
			t.Fatalf("ask while the slow path holds more slots than the node has: %v", err)
		}
	}
	close(release)
	testkit.Eventually(t, 10*time.Second, "every tell handled", func() bool { return done.Load() == tells })
	if p := peak.Load(); p != own {
		t.Fatalf("peak concurrency %d, want the path's own %d", p, own)
	}
	if err := w.Handle("bad", func(context.Context, *bus.Request) (any, error) { return nil, nil }, bus.OwnSlots(-1)); err == nil {
		t.Fatal("Handle with negative own slots: no error")
	}
}

// TestPlainNATSClients: a handler also serves requests without the Mu envelope, such as
// `nats req` sends; the subject names the sender.
func TestPlainNATSClients(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	nc := dial(t, s.url)
	c := connect(t, s.url, coordinator("c1"))
	must(t, bus.Handle(c, "api.status", func(_ context.Context, from bus.Address, req map[string]string) (map[string]string, error) {
		if from != (bus.Address{Role: bus.RoleClient, ID: "cli-1"}) {
			return nil, fmt.Errorf("from %v", from)
		}
		if req["jobId"] == "" {
			return nil, errors.New("Unknown job: ")
		}
		return map[string]string{"jobId": req["jobId"], "state": "QUEUED"}, nil
	}, bus.AsRole()))
	m, err := nc.Request("jobbus.role.coordinator.client.cli-1.api.status", []byte(`{"jobId":"j1"}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != `{"jobId":"j1","state":"QUEUED"}` || m.Header.Get(bus.HeaderKind) != "RESPONSE" {
		t.Fatalf("answer %q %v", m.Data, m.Header)
	}
	m, err = nc.Request("jobbus.node.coordinator.c1.client.cli-1.api.status", []byte(`{}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "Unknown job: " || m.Header.Get(bus.HeaderKind) != "ERROR" {
		t.Fatalf("error answer %q %v", m.Data, m.Header)
	}
}

// TestSenderIsTheSubjects: a handler learns who sent a message from its subject, which
// NATS permissions control, and never from a Jobbus-From header, which anyone may write.
func TestSenderIsTheSubjects(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	nc := dial(t, s.url)
	c := connect(t, s.url, coordinator("c1"))
	whoAmI(t, c, "who", bus.AsRole())
	for _, subj := range []string{
		"jobbus.role.coordinator.worker.edge-2.who",
		"jobbus.node.coordinator.c1.worker.edge-2.who",
	} {
		t.Run(subj, func(t *testing.T) {
			ans, err := nc.RequestMsg(natsMsg(subj, bus.HeaderFrom, "worker/edge-1"), 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var got echo
			if err := json.Unmarshal(ans.Data, &got); err != nil {
				t.Fatalf("answer %q: %v", ans.Data, err)
			}
			if got.From != "worker/edge-2" {
				t.Fatalf("handler saw sender %q, want worker/edge-2 (the subject's), not the header's", got.From)
			}
		})
	}
}

// TestMalformedEnvelope: a bad peer gets an ERROR answer; the handler never sees it.
func TestMalformedEnvelope(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	nc := dial(t, s.url)
	w := connect(t, s.url, worker("w1"))
	var called atomic.Int64
	must(t, w.Handle("p", func(context.Context, *bus.Request) (any, error) { called.Add(1); return nil, nil }))
	tests := []struct{ name, sender, key, value string }{
		{"UnknownKind", "worker.w2", bus.HeaderKind, "GOSSIP"},
		{"WrongKind", "worker.w2", bus.HeaderKind, "RESPONSE"},
		{"SenderRoleNotPlain", "~d29ya2Vy.w2", bus.HeaderKind, "ASK"},
		{"SenderIDNotAToken", "worker.a~b", bus.HeaderKind, "ASK"},
		{"SenderIDEmptyEncoding", "worker.~", bus.HeaderKind, "ASK"},
		{"SenderIDNotCanonical", "worker.~dzI", bus.HeaderKind, "ASK"}, // "w2", which is plain
		{"SenderIDBadBase64", "worker.~d", bus.HeaderKind, "ASK"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := natsMsg("jobbus.node.worker.w1."+tt.sender+".p", tt.key, tt.value)
			ans, err := nc.RequestMsg(m, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if ans.Header.Get(bus.HeaderKind) != "ERROR" {
				t.Fatalf("answer %q %v, want ERROR", ans.Data, ans.Header)
			}
		})
	}
	if called.Load() != 0 {
		t.Fatalf("handler called %d times for malformed messages", called.Load())
	}
	if st := w.Stats(); st.Dropped != uint64(len(tests)) {
		t.Fatalf("dropped %d, want %d", st.Dropped, len(tests))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// natsMsg is a request with one header set, as a foreign peer might send.
func natsMsg(subject, key, value string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(key, value)
	return m
}

// spaced writes itself with spaces json.Marshal would compact away.
type spaced struct{ N int }

func (s spaced) MarshalJSON() ([]byte, error) { return fmt.Appendf(nil, `{ "n": %d }`, s.N), nil }

// TestPayloadEncoding: what each kind of message arrives as.
func TestPayloadEncoding(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"))
	w := connect(t, s.url, worker("w1"))
	must(t, w.Handle("echo", func(_ context.Context, r *bus.Request) (any, error) { return r.Data, nil }))
	tests := []struct {
		name string
		msg  any
		want string
	}{
		{"Nil", nil, ""},
		{"Bytes", []byte("not json"), "not json"},
		{"RawMessage", json.RawMessage(`{"a":1}`), `{"a":1}`},
		{"Struct", struct{ A int }{1}, `{"A":1}`},
		{"MarshalerAsItWrites", spaced{7}, `{ "n": 7 }`},
		{"NilMarshalerPointer", (*spaced)(nil), "null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := bus.Ask[[]byte](context.Background(), c, w.Self(), "echo", tt.msg)
			if err != nil || string(got) != tt.want {
				t.Fatalf("arrived as %q (%v), want %q", got, err, tt.want)
			}
		})
	}
}
