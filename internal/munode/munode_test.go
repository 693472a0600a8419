package munode_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol/mu"
	"github.com/jobbus/jobbus/internal/munode"
	"github.com/jobbus/jobbus/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher()) }

// waitFor bounds every wait: generous, since the machine is shared.
const waitFor = 20 * time.Second

// muPort starts an embedded nats-server and a bridge with only its Mu port on, and
// returns the port's address.
func muPort(t *testing.T) string {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(waitFor) {
		t.Fatal("nats-server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := bridge.DefaultConfig()
	cfg.WorkerListen, cfg.ClientListen, cfg.MuListen = "", "", "127.0.0.1:0"
	br, err := bridge.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = br.Close() })
	return br.MuAddr().String()
}

func dial(t *testing.T, addr string, self mu.Address, log *slog.Logger) *munode.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	n, err := munode.Dial(ctx, addr, self, munode.Options{Timeout: waitFor, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// TestHandlerPanicIsAnError: a handler that panics answers its ASK with an ERROR and is
// logged with its stack, and the node keeps serving; a panicking TELL handler costs
// nothing more.
func TestHandlerPanicIsAnError(t *testing.T) {
	t.Parallel()
	addr := muPort(t)
	var logs testkit.Buffer
	serving := dial(t, addr, mu.Address{Host: "127.0.0.1", Port: 27001},
		slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	serving.Handle("boom", func(context.Context, *mu.Message) (json.RawMessage, error) { panic("kaboom") })
	serving.Handle("echo", munode.Echo)
	asking := dial(t, addr, mu.Address{Host: "127.0.0.1", Port: 27002}, nil)

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := asking.Tell("boom@127.0.0.1:27001", nil); err != nil {
		t.Fatal(err)
	}
	_, err := asking.Ask(ctx, "boom@127.0.0.1:27001", nil)
	if !errors.Is(err, munode.ErrRemote) || !strings.Contains(err.Error(), "kaboom") {
		t.Fatalf("ask of a panicking handler: %v, want an ERROR naming the panic", err)
	}
	got, err := asking.Ask(ctx, "echo@127.0.0.1:27001", json.RawMessage(`"still here"`))
	if err != nil || string(got) != `"still here"` {
		t.Fatalf("ask after the panic: %s, %v", got, err)
	}
	testkit.Eventually(t, waitFor, "both panics logged", func() bool {
		return strings.Count(logs.String(), "level=ERROR msg=\"mu handler panicked\"") == 2
	})
	if !strings.Contains(logs.String(), "munode_test.go") {
		t.Fatalf("the panic's log has no stack:\n%s", logs.String())
	}
}
