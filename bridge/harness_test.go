package bridge_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
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
	"github.com/jobbus/jobbus/internal/testkit/specpeer"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher())
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
	cfg.ShutdownTimeout = 2 * time.Second
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

// peer plays a spec peer on one TCP connection, byte-exactly: specpeer.Peer, with
// every wait bounded by waitFor.
type peer = specpeer.Peer

func dial(t testing.TB, addr net.Addr) *peer {
	t.Helper()
	return specpeer.Dial(t, addr.String(), specpeer.WithTimeout(waitFor))
}

func (s *system) client() *peer { return dial(s.t, s.br.ClientAddr()) }

// worker registers a spec worker on a connection of its own.
func (s *system) worker(id string, capacity int) *peer {
	s.t.Helper()
	p := dial(s.t, s.br.WorkerAddr())
	p.Register(id, capacity)
	return p
}

// specWorker is a healthy spec TCP worker: it heartbeats every 50 ms and completes
// every task it is assigned with the result "done".
func (s *system) specWorker(id string, capacity int) *specpeer.Worker {
	s.t.Helper()
	return specpeer.StartWorker(s.t, s.br.WorkerAddr().String(), id, capacity, 50*time.Millisecond, specpeer.WithTimeout(waitFor))
}

// healthy proves the system still works: n jobs submitted through a fresh client
// connection all complete on whatever worker is healthy.
func (s *system) healthy(n int) {
	s.t.Helper()
	c := s.client()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = c.Submit("SHA256", fmt.Sprintf(`{"text":"healthy %d"}`, i))
	}
	for _, id := range ids {
		if j := s.waitState(id, protocol.StateCompleted); j.Result == nil || *j.Result != "done" {
			s.t.Fatalf("job %s result %v", id, j.Result)
		}
	}
	_ = c.Close()
}

// header is a raw length prefix, including lengths a Writer refuses.
func header(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

// isClosedErr reports an error that means the peer closed the connection.
func isClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, frame.ErrTruncated) ||
		errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe")
}
