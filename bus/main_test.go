package bus_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bus"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testServer is an embedded nats-server on a loopback port.
type testServer struct {
	srv  *server.Server
	port int
	url  string
}

// startServer starts a server on port (-1 for a random one) and stops it when the test
// ends.
func startServer(tb testing.TB, port int) *testServer {
	tb.Helper()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true,
	})
	if err != nil {
		tb.Fatalf("new server: %v", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		tb.Fatal("nats-server not ready")
	}
	tb.Cleanup(func() { stopServer(srv) })
	p := srv.Addr().(*net.TCPAddr).Port
	return &testServer{srv: srv, port: p, url: fmt.Sprintf("nats://127.0.0.1:%d", p)}
}

func stopServer(srv *server.Server) {
	srv.Shutdown()
	srv.WaitForShutdown()
}

// freePort reserves a loopback port and releases it for a server started later.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// connect returns a node with a connection of its own, closed when the test ends.
func connect(tb testing.TB, url string, self bus.Address, opts ...bus.Option) *bus.Node {
	tb.Helper()
	opts = append([]bus.Option{
		bus.WithLogger(quiet()),
		bus.WithNATSOptions(nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0)),
	}, opts...)
	n, err := bus.Connect(context.Background(), url, self, opts...)
	if err != nil {
		tb.Fatalf("connect %s: %v", self, err)
	}
	tb.Cleanup(func() { _ = n.Close() })
	return n
}

// dial returns a plain connection, closed when the test ends.
func dial(tb testing.TB, url string) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// recv waits for a value on ch.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func worker(id string) bus.Address      { return bus.Address{Role: bus.RoleWorker, ID: id} }
func coordinator(id string) bus.Address { return bus.Address{Role: bus.RoleCoordinator, ID: id} }
func anyOf(r bus.Role) bus.Address      { return bus.Address{Role: r} }

// whoAmI makes n answer path with its own address and the asker's.
func whoAmI(t *testing.T, n *bus.Node, path string, opts ...bus.HandleOption) {
	t.Helper()
	err := bus.Handle(n, path, func(_ context.Context, from bus.Address, _ struct{}) (echo, error) {
		return echo{Me: n.Self().String(), From: from.String()}, nil
	}, opts...)
	if err != nil {
		t.Fatalf("handle %s: %v", path, err)
	}
}

type echo struct {
	Me   string `json:"me"`
	From string `json:"from"`
}
