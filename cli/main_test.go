package cli_test

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
)

func TestMain(m *testing.M) {
	if os.Getenv(recorderEnv) != "" { // this binary as a worker process (restart_attempts_test.go)
		os.Exit(runRecordingWorker())
	}
	cleanup := buildBinary() // for the tests that run jobbus as a process of its own
	goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher(), goleak.Cleanup(func(int) { cleanup() }))
}

// system is what the CLI talks to: an in-process jobbus system with (unless noWorker)
// one native worker.
type system struct {
	*jobbustest.System
	t          *testing.T
	url        string
	clientAddr string // the bridge's client port, once startBridge ran
}

type setupConfig struct {
	system []jobbustest.Option
	worker bool
}

type setupOption func(*setupConfig)

func withConfig(mod func(*coordinator.Config)) setupOption {
	return func(c *setupConfig) { c.system = append(c.system, jobbustest.WithCoordinatorConfig(mod)) }
}

func noWorker() setupOption { return func(c *setupConfig) { c.worker = false } }

func setup(t *testing.T, opts ...setupOption) *system {
	t.Helper()
	cfg := setupConfig{worker: true}
	for _, o := range opts {
		o(&cfg)
	}
	s := newSystem(t, jobbustest.Start(t, cfg.system...))
	if cfg.worker {
		s.startWorker()
	}
	return s
}

// startNATS starts only the NATS server: no coordinator answers there.
func startNATS(t *testing.T) *system {
	t.Helper()
	return newSystem(t, jobbustest.Start(t, jobbustest.WithoutCoordinator()))
}

func newSystem(t *testing.T, sys *jobbustest.System) *system {
	return &system{System: sys, t: t, url: sys.Server.ClientURL()}
}

// startWorker runs a native worker until the test ends or stop is called, and waits
// until the coordinator lists it.
func (s *system) startWorker() (id string, stop func()) {
	s.t.Helper()
	w, stop := s.StartNativeWorker(s.t)
	eventually(s.t, "worker "+w.ID()+" listed", func() bool {
		_, out, _ := s.run("workers", "--json")
		return strings.Contains(out, w.ID())
	})
	return w.ID(), stop
}

// startBridge serves the TCP client port (on a free loopback port) in front of s.
func (s *system) startBridge() {
	s.t.Helper()
	// The bridge waits up to its request timeout for a coordinator to serve: shorter
	// than the client's own, so a test without one hears "coordinator unavailable".
	s.clientAddr = s.StartBridge(s.t, func(c *bridge.Config) {
		c.WorkerListen, c.RequestTimeout = "", time.Second
	}).ClientAddr().String()
}

// transport is how the CLI reaches the coordinator: its global flags, and what the
// system needs for them.
type transport struct {
	name    string
	prepare func(s *system)
	flags   func(s *system) []string
}

var (
	natsTransport = transport{"NATS", func(*system) {}, func(s *system) []string { return []string{"--nats", s.url} }}
	// The TCP client port of the bridge; --nats points nowhere, so nothing goes native.
	tcpTransport = transport{"TCP", (*system).startBridge, func(s *system) []string {
		return []string{"--nats", "nats://127.0.0.1:1", "--connect", s.clientAddr}
	}}
)

// transports lists every transport the tests run over.
func transports() []transport { return []transport{natsTransport, tcpTransport} }

// appMu runs one CLI app at a time: urfave/cli v2 writes to package-level values
// (HelpFlag, its help command) while it sets an app up, so apps running at once in one
// process race. A real process runs one app; the tests' systems still run in parallel.
var appMu sync.Mutex

// cliRun runs the CLI in-process with global flags before args.
func cliRun(global []string, args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = runApp(append(append([]string{"jobbus"}, global...), args...), &out, &errb)
	return code, out.String(), errb.String()
}

// runApp is cli.Run under appMu, for a test that gives the CLI writers of its own.
func runApp(argv []string, stdout, stderr io.Writer) int {
	appMu.Lock()
	defer appMu.Unlock()
	return cli.Run(argv, stdout, stderr)
}

// run runs the CLI against s over NATS.
func (s *system) run(args ...string) (int, string, string) {
	return cliRun(natsTransport.flags(s), args...)
}

// over is a system as seen through one transport.
type over struct {
	*system
	tr transport
}

func (o over) run(args ...string) (int, string, string) {
	return cliRun(o.tr.flags(o.system), args...)
}

// mustRun runs and fails the test unless the exit code is want.
func (o over) mustRun(want int, args ...string) (stdout, stderr string) {
	o.t.Helper()
	code, out, errs := o.run(args...)
	if code != want {
		o.t.Fatalf("jobbus %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out, errs)
	}
	return out, errs
}

// jsonLines parses one JSON object per line into T.
func jsonLines[T any](t *testing.T, out string) []T {
	t.Helper()
	var vs []T
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var v T
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		vs = append(vs, v)
	}
	return vs
}

func jsonJob(t *testing.T, out string) protocol.Job {
	t.Helper()
	jobs := jsonLines[protocol.Job](t, out)
	if len(jobs) != 1 {
		t.Fatalf("want one job line, got %d: %s", len(jobs), out)
	}
	return jobs[0]
}

// eventually polls cond until it holds or 15 s pass.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, 15*time.Second, what, cond)
}
