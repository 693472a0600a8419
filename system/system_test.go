package system_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/internal/testkit/specpeer"
	"github.com/jobbus/jobbus/system"
	"github.com/jobbus/jobbus/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher()) }

// embedded is an embedded server on a free port, its store in dir.
func embedded(dir string) system.NATS {
	return system.NATS{Server: []embeddednats.Option{embeddednats.WithListen("127.0.0.1:-1")}, StoreDir: dir}
}

// fastCoordinator is a coordinator with millisecond timings.
func fastCoordinator() *coordinator.Config {
	cfg := jobbustest.FastCoordinatorConfig()
	return &cfg
}

// quietWorkers are n local workers that log nothing.
func quietWorkers(n int) system.Workers {
	return system.Workers{Count: n, Options: func() []worker.Option { return []worker.Option{worker.WithLogger(nil)} }}
}

// freeBridge is a bridge with both ports on free loopback ports.
func freeBridge() *bridge.Config {
	cfg := bridge.DefaultConfig()
	cfg.WorkerListen, cfg.ClientListen = "127.0.0.1:0", "127.0.0.1:0"
	return &cfg
}

// start starts cfg's system and closes it when the test ends.
func start(t *testing.T, cfg system.Config) *system.System {
	t.Helper()
	sys, err := system.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = sys.Close() })
	return sys
}

// leading waits until sys's coordinator leads.
func leading(t *testing.T, sys *system.System) *coordinator.Coordinator {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := sys.Leading(ctx)
	if err != nil {
		t.Fatalf("leading: %v", err)
	}
	return c
}

// leaderID is the coordinator the leader lease names.
func leaderID(t *testing.T, sys *system.System) string {
	t.Helper()
	js, err := jetstream.New(sys.Conn())
	if err != nil {
		t.Fatal(err)
	}
	id, err := coordinator.Leader(context.Background(), js)
	if err != nil {
		t.Fatalf("leader: %v", err)
	}
	return id
}

// completes submits a SHA256 job over cl and waits until it completes.
func completes(t *testing.T, cl *client.Client, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id, err := cl.Submit(ctx, "SHA256", map[string]string{"text": text})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	job, err := cl.Wait(ctx, id)
	if err != nil || job.State != protocol.StateCompleted {
		t.Fatalf("job %s: %+v, %v; want it COMPLETED", id, job, err)
	}
}

// get fetches path from the HTTP listener at addr.
func get(t *testing.T, addr net.Addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr.String() + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestServeSystem: the whole system as serve builds it. Its coordinator leads through
// the election (the lease names it), a job submitted natively and one over the TCP
// client port complete on the local worker, /readyz says the coordinator leads and
// /metrics counts the jobs; Close stops every part, more than once, and frees its
// ports. With SyncJobs the coordinator fsyncs the jobs stream itself.
func TestServeSystem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		syncJobs bool
	}{{"Default", false}, {"SyncJobs", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nats := embedded(t.TempDir())
			nats.SyncJobs = tc.syncJobs
			sys := start(t, system.Config{
				NATS: nats, Coordinator: fastCoordinator(), Bridge: freeBridge(),
				HTTPListen: "127.0.0.1:0", Metrics: true, Workers: quietWorkers(1),
			})
			if c := leading(t, sys); !c.Stats().Serving {
				t.Fatal("the coordinator Leading returned does not serve")
			}
			id := leaderID(t, sys)
			ctx := context.Background()

			completes(t, client.New(sys.Conn()), "native")
			tcp, err := client.DialTCP(ctx, sys.Bridge().ClientAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer tcp.Close()
			completes(t, tcp, "tcp")

			testkit.Eventually(t, 10*time.Second, "/readyz ready", func() bool {
				code, body := get(t, sys.HTTPAddr(), "/readyz")
				return code == http.StatusOK && strings.Contains(body, "coordinator "+id+" leads")
			})
			if _, body := get(t, sys.HTTPAddr(), "/metrics"); !strings.Contains(body, `jobbus_jobs_completed_total{task_type="SHA256"} 2`) {
				t.Errorf("/metrics does not count the two jobs:\n%s", body)
			}

			httpAddr, clientAddr := sys.HTTPAddr().String(), sys.Bridge().ClientAddr().String()
			if err := sys.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			if err := sys.Close(); err != nil {
				t.Fatalf("close again: %v", err)
			}
			for _, addr := range []string{httpAddr, clientAddr} {
				if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
					conn.Close()
					t.Errorf("%s still listening after Close", addr)
				}
			}
		})
	}
}

// TestJoinedSystem: a system joins another's NATS at its URL, as serve --nats does:
// its coordinator leads there and its workers, each on a connection of its own, run
// what its bridge and the NATS API take in. A second system with only a bridge (as
// `jobbus bridge`) serves the same coordinator.
func TestJoinedSystem(t *testing.T) {
	t.Parallel()
	host := start(t, system.Config{NATS: embedded(t.TempDir())})
	url := system.NATS{URL: host.ClientURL(), Name: "jobbus test"}
	sys := start(t, system.Config{
		NATS: url, Coordinator: fastCoordinator(), Bridge: freeBridge(),
		Workers: system.Workers{Count: 2, Dial: true, Options: func() []worker.Option {
			return []worker.Option{worker.WithLogger(nil)}
		}},
	})
	if sys.Server() != nil || sys.StoreDir() != "" {
		t.Fatalf("a joined system reports an embedded server (%v) or store (%q)", sys.Server(), sys.StoreDir())
	}
	leading(t, sys)
	completes(t, client.New(host.Conn()), "native")
	ctx := context.Background()
	bridgeOnly := start(t, system.Config{NATS: url, Bridge: freeBridge()})
	for _, s := range []*system.System{sys, bridgeOnly} {
		tcp, err := client.DialTCP(ctx, s.Bridge().ClientAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		completes(t, tcp, "tcp")
		_ = tcp.Close()
	}
	testkit.Eventually(t, 10*time.Second, "two workers listed", func() bool {
		ws, err := client.New(host.Conn()).Workers(ctx)
		return err == nil && len(ws) == 2
	})
}

// TestStoredCoordinatorID: on an embedded store the coordinator keeps its identity
// in the store directory, so a system started again on it leads under the same name
// (and takes a lease left by a crash back at once); a configured ID wins.
func TestStoredCoordinatorID(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	run := func(cfg *coordinator.Config) string {
		sys, err := system.Start(context.Background(), system.Config{NATS: embedded(dir), Coordinator: cfg})
		if err != nil {
			t.Fatal(err)
		}
		defer sys.Close()
		leading(t, sys)
		return leaderID(t, sys)
	}
	first := run(fastCoordinator())
	if second := run(fastCoordinator()); second != first || !strings.HasPrefix(first, "coordinator-") {
		t.Fatalf("restarted on the same store as %q, first as %q", second, first)
	}
	kept, err := os.ReadFile(filepath.Join(dir, "jobbus-coordinator-id"))
	if err != nil || strings.TrimSpace(string(kept)) != first {
		t.Fatalf("the store keeps %q (%v), want %q", kept, err, first)
	}
	named := fastCoordinator()
	named.ID = "coordinator-named"
	if got := run(named); got != "coordinator-named" {
		t.Fatalf("a configured ID led as %q", got)
	}
}

// TestStoredCoordinatorIDFollowsTheConfigFile: when a nats-server configuration file
// sets the store (store_dir), the coordinator's identity is kept there, with the store
// it names, and not in a StoreDir the file overrode (serve's --data-dir, which may not
// even exist: serve failed at start "keep coordinator id in ./data").
func TestStoredCoordinatorIDFollowsTheConfigFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store, file := filepath.Join(dir, "store"), filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(file, []byte("jetstream { store_dir: "+strconv.Quote(store)+" }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	overridden := filepath.Join(dir, "no-such-dir")
	sys := start(t, system.Config{Coordinator: fastCoordinator(), NATS: system.NATS{StoreDir: overridden,
		Server: []embeddednats.Option{embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithConfigFile(file)}}})
	leading(t, sys)
	kept, err := os.ReadFile(filepath.Join(store, "jobbus-coordinator-id"))
	if id := leaderID(t, sys); err != nil || strings.TrimSpace(string(kept)) != id {
		t.Fatalf("the file's store keeps %q (%v), want the leader %q", kept, err, id)
	}
	if got := sys.StoreDir(); got != store {
		t.Errorf("StoreDir is %q, want the file's %q", got, store)
	}
}

// TestStartFailureStopsWhatStarted: a part that cannot start (the HTTP port is
// taken) fails Start with what went wrong, and what had started is stopped: the store
// is free for the next system, and goleak (TestMain) finds no goroutine left.
func TestStartFailureStopsWhatStarted(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	cfg := system.Config{NATS: embedded(dir), Coordinator: fastCoordinator(), Bridge: freeBridge(),
		HTTPListen: taken.Addr().String(), Workers: quietWorkers(1)}
	if sys, err := system.Start(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "port in use") {
		if sys != nil {
			_ = sys.Close()
		}
		t.Fatalf("Start with its HTTP port taken: %v", err)
	}
	cfg.HTTPListen = ""
	leading(t, start(t, cfg))
}

// TestConfigRefused: a configuration that cannot be built is refused with every
// problem at once, before anything starts.
func TestConfigRefused(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "never")
	badCoordinator := fastCoordinator()
	badCoordinator.MaxAttempts = 0
	badBridge := freeBridge()
	badBridge.MaxConns = 0
	_, err := system.Start(context.Background(), system.Config{
		NATS:        system.NATS{URL: "nats://127.0.0.1:1", StoreDir: dir, SyncJobs: true},
		Coordinator: badCoordinator, Bridge: badBridge, Workers: system.Workers{Count: -1},
	})
	for _, want := range []string{"with a NATS URL", "max attempts", "MaxConns", "Workers.Count"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Start: %v; want it to say %q", err, want)
		}
	}
	_, err = system.Start(context.Background(), system.Config{NATS: system.NATS{SyncJobs: true}})
	if err == nil || !strings.Contains(err.Error(), "SyncJobs without a coordinator") {
		t.Errorf("SyncJobs without a coordinator: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused configuration made its store: %v", err)
	}
	if _, err := start(t, system.Config{NATS: embedded(t.TempDir())}).Leading(context.Background()); !errors.Is(err, system.ErrNoCoordinator) {
		t.Errorf("Leading without a coordinator: %v", err)
	}
}

// TestDrain: Drain lets a local worker's running job finish and report, then Close
// stops the system.
func TestDrain(t *testing.T) {
	t.Parallel()
	sys := start(t, system.Config{NATS: embedded(t.TempDir()), Coordinator: fastCoordinator(),
		Workers: quietWorkers(1)})
	leading(t, sys)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := client.New(sys.Conn())
	id, err := cl.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 300})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the job running", func() bool {
		j, err := cl.Status(ctx, id)
		return err == nil && j.State == protocol.StateRunning
	})
	if err := sys.Drain(ctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if j, err := cl.Status(ctx, id); err != nil || j.State != protocol.StateCompleted {
		t.Fatalf("after the drain: %+v, %v; want COMPLETED", j, err)
	}
	if err := sys.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestHealthWhileWaitingForNATS: a system that joins NATS at a URL waits for it at
// start-up; meanwhile its HTTP listener already answers, /healthz 200 (the process is
// up: a liveness probe must not restart it for its NATS being away) and /readyz 503
// with the reason, and once NATS is there the rest is served.
func TestHealthWhileWaitingForNATS(t *testing.T) {
	t.Parallel()
	host := start(t, system.Config{NATS: embedded(t.TempDir())})
	nats := testkit.NewProxy(t, strings.TrimPrefix(host.ClientURL(), "nats://"))
	nats.Cut() // NATS unreachable while the system starts
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr()
	_ = l.Close()

	type started struct {
		sys *system.System
		err error
	}
	done := make(chan started, 1)
	go func() {
		sys, err := system.Start(context.Background(), system.Config{
			NATS: system.NATS{URL: "nats://" + nats.Addr()}, Coordinator: fastCoordinator(), HTTPListen: addr.String(), Metrics: true,
		})
		done <- started{sys, err}
	}()
	answers := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testkit.Eventually(t, 10*time.Second, "/healthz answered while NATS is away", func() bool {
		code, _ := answers("/healthz")
		return code == http.StatusOK
	})
	if code, body := answers("/readyz"); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not ready: NATS not connected") {
		t.Errorf("/readyz while NATS is away: %d %q", code, body)
	}
	select {
	case s := <-done:
		t.Fatalf("Start returned without NATS: %v", s.err)
	default:
	}

	nats.Restore()
	var s started
	select {
	case s = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Start did not return once NATS was there")
	}
	if s.err != nil {
		t.Fatalf("start: %v", s.err)
	}
	t.Cleanup(func() { _ = s.sys.Close() })
	leading(t, s.sys)
	testkit.Eventually(t, 10*time.Second, "/readyz ready", func() bool {
		code, _ := answers("/readyz")
		return code == http.StatusOK
	})
	if code, body := answers("/metrics"); code != http.StatusOK || !strings.Contains(body, "jobbus_coordinator_leading 1") {
		t.Errorf("/metrics: %d, %d bytes", code, len(body))
	}
	if code, body := answers("/api/summary"); code != http.StatusOK || !strings.Contains(body, `"counts"`) {
		t.Errorf("/api/summary: %d %q", code, body)
	}
}

// TestEmbeddedStoreLimit: the embedded server's cap on its store reaches the
// coordinator, which keeps the jobs bucket under it (room for the leader lease when
// the store fills with jobs: coordinator.Config.StoreLimit).
func TestEmbeddedStoreLimit(t *testing.T) {
	t.Parallel()
	const limit = 64 << 20
	nats := embedded(t.TempDir())
	nats.Server = append(nats.Server, embeddednats.WithJetStreamLimits(0, limit))
	sys := start(t, system.Config{NATS: nats, Coordinator: fastCoordinator()})
	leading(t, sys)
	js, err := jetstream.New(sys.Conn())
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), "KV_"+protocol.JobsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxBytes; got <= 0 || got >= limit {
		t.Fatalf("the jobs bucket's max bytes on a store capped at %d: %d, want a limit below the cap", limit, got)
	}
}

// TestCloseStopsTheBridgeWhileTheCoordinatorRuns: Close closes the bridge before the
// coordinator, which is still there to take what the bridge delivers as it stops (the
// TCP workers' results it read, then their losses). Seen here by the loss: a spec
// worker holds a running job of one attempt when the system closes, and the system
// started again on the store finds the job already ended by that loss. Before, the
// coordinator stopped first: the bridge delivered to nobody, a result it had read was
// lost with its attempt, and the job was still RUNNING after the restart.
func TestCloseStopsTheBridgeWhileTheCoordinatorRuns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	calm := fastCoordinator()
	calm.HeartbeatTimeout, calm.TaskTimeout = time.Hour, time.Hour // only the bridge loses the worker
	sys, err := system.Start(context.Background(), system.Config{NATS: embedded(dir), Coordinator: calm, Bridge: freeBridge()})
	if err != nil {
		t.Fatal(err)
	}
	leading(t, sys)
	w := specpeer.Dial(t, sys.Bridge().WorkerAddr().String(), specpeer.WithTimeout(20*time.Second))
	w.Register("held-at-close", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id, err := client.New(sys.Conn()).Submit(ctx, "SHA256", map[string]string{"text": "x"}, client.MaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	w.ExpectAssign(id)
	if err := sys.Close(); err != nil {
		t.Fatal(err)
	}

	again := start(t, system.Config{NATS: embedded(dir), Coordinator: calm})
	leading(t, again)
	j, err := client.New(again.Conn()).Status(ctx, id)
	if err != nil || j.State != protocol.StateFailed || !strings.Contains(deref(j.Error), "connection closed") {
		t.Fatalf("job after the restart: %+v (error %q), %v; want FAILED by the loss the bridge reported as it closed", j, deref(j.Error), err)
	}
}

func deref(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}
