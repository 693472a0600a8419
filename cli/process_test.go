package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/testkit"
)

// binVersion is the version the test binary is built with, through the linker flag
// CONTRIBUTING.md gives for a release.
const binVersion = "9.8.7-test"

// jobbusBin is the jobbus binary TestMain built, for tests that need a real process:
// signals, exit codes, a process that dies.
var jobbusBin string

// buildBinary builds jobbus once for the package's tests and returns what removes it.
func buildBinary() (cleanup func()) {
	dir, err := os.MkdirTemp("", "jobbus-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "build jobbus:", err)
		os.Exit(1)
	}
	jobbusBin = filepath.Join(dir, "jobbus")
	cmd := exec.Command("go", "build", "-o", jobbusBin,
		"-ldflags", "-X github.com/jobbus/jobbus/internal/version.version="+binVersion, "github.com/jobbus/jobbus")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build jobbus: %v\n%s", err, out)
		os.Exit(1)
	}
	return func() { os.RemoveAll(dir) }
}

// proc is jobbus running as a process of its own.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout *testkit.Buffer
	stderr *testkit.Buffer
	done   chan struct{}
	code   int
}

// startProc runs jobbus with args; the test's end kills it if it still runs.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startCommand(t, "jobbus "+strings.Join(args, " "), exec.Command(jobbusBin, args...), env)
}

// startCommand starts cmd with env added, named name in the failed test's log; the
// test's end kills it if it still runs.
func startCommand(t *testing.T, name string, cmd *exec.Cmd, env []string) *proc {
	t.Helper()
	cmd.Env = append(os.Environ(), env...)
	p := &proc{t: t, cmd: cmd, stdout: &testkit.Buffer{}, stderr: &testkit.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		defer close(p.done)
		_ = cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, p.stderr.String())
		}
	})
	return p
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(30 * time.Second):
		p.t.Fatalf("jobbus still running after 30s; stderr:\n%s", p.stderr.String())
		return -1
	}
}

// logged waits until the process's log has a line matching re, and returns its
// submatches.
func (p *proc) logged(re string) []string {
	p.t.Helper()
	rx := regexp.MustCompile(re)
	var m []string
	eventually(p.t, "log line "+re, func() bool {
		m = rx.FindStringSubmatch(p.stderr.String())
		return m != nil
	})
	return m
}

// procSystem is an in-process system (no worker) whose workers are lost only after 5 s
// of silence, for workers that run as processes on a loaded machine.
func procSystem(t *testing.T) *system {
	return setup(t, noWorker(), withConfig(func(c *coordinator.Config) { c.HeartbeatTimeout = 5 * time.Second }))
}

// startWorkerProc runs `jobbus worker` against s and waits until the coordinator lists it.
func (s *system) startWorkerProc(args ...string) *proc {
	s.t.Helper()
	id := fmt.Sprintf("proc-%d", time.Now().UnixNano())
	p := startProc(s.t, nil, append([]string{"worker", "--nats", s.url, "--id", id, "--heartbeat-interval-millis", "100"}, args...)...)
	eventually(s.t, "worker process listed", func() bool {
		_, out, _ := s.run("workers", "--json")
		return strings.Contains(out, id)
	})
	return p
}

func (s *system) submitSleep(ms int) string {
	s.t.Helper()
	id, err := client.New(s.NC).Submit(context.Background(), "SLEEP", json.RawMessage(fmt.Sprintf(`{"durationMillis":%d}`, ms)))
	if err != nil {
		s.t.Fatal(err)
	}
	return id
}

func (s *system) job(id string) protocol.Job {
	s.t.Helper()
	j, err := client.New(s.NC).Status(context.Background(), id)
	if err != nil {
		s.t.Fatal(err)
	}
	return j
}

func (s *system) waitState(id string, states ...protocol.State) protocol.Job {
	s.t.Helper()
	var j protocol.Job
	eventually(s.t, fmt.Sprintf("job %s in %v", id, states), func() bool {
		j = s.job(id)
		for _, st := range states {
			if j.State == st {
				return true
			}
		}
		return false
	})
	return j
}

// TestWorkerDrainsOnSIGTERM: a worker told to stop finishes its running job within its
// first attempt, then exits 0.
func TestWorkerDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	s := procSystem(t)
	p := s.startWorkerProc("--shutdown-grace", "30s")
	id := s.submitSleep(500)
	s.waitState(id, protocol.StateRunning)
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("worker exited %d after SIGTERM, want 0", code)
	}
	j := s.job(id)
	if j.State != protocol.StateCompleted || j.Attempts != 1 {
		t.Errorf("job %s after %d attempts, want COMPLETED after 1: the drain let it finish", j.State, j.Attempts)
	}
	for _, want := range []string{"draining", "worker drained"} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("worker log lacks %q:\n%s", want, p.stderr.String())
		}
	}
}

// TestWorkerShutdownGrace: when the grace runs out, or at a second signal, the worker
// cancels what still runs and exits 0; the job's attempt is spent, and it retries.
func TestWorkerShutdownGrace(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		grace      string
		secondSig  bool
		wantLogged string
	}{
		{"GraceRunsOut", "200ms", false, "shutdown grace over"},
		{"SecondSignalStopsAtOnce", "10m", true, "second signal: stopping now"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := procSystem(t)
			p := s.startWorkerProc("--shutdown-grace", tc.grace)
			id := s.submitSleep(600000)
			s.waitState(id, protocol.StateRunning)
			p.signal(syscall.SIGTERM)
			if tc.secondSig {
				p.logged("draining")
				p.signal(syscall.SIGINT)
			}
			if code := p.wait(); code != 0 {
				t.Fatalf("worker exited %d, want 0", code)
			}
			p.logged(tc.wantLogged)
			j := s.waitState(id, protocol.StateQueued, protocol.StateRetryWait)
			if j.Attempts != 1 {
				t.Errorf("job back in %s after %d attempts, want 1 spent", j.State, j.Attempts)
			}
		})
	}
}

// TestWorkerSaysNATSIsUnreachable: a worker with no NATS to talk to says so, not that
// the coordinator is silent, and still stops on a signal.
func TestWorkerSaysNATSIsUnreachable(t *testing.T) {
	t.Parallel()
	p := startProc(t, nil, "worker", "--nats", "nats://user:secret@127.0.0.1:1")
	p.logged(`NATS unreachable; waiting for it.*nats=nats://127\.0\.0\.1:1`)
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	if strings.Contains(p.stderr.String(), "secret") || strings.Contains(p.stderr.String(), "waiting for the coordinator") {
		t.Errorf("log shows the password or blames the coordinator:\n%s", p.stderr.String())
	}
}

// TestBinaryVersion: a binary built with the release -ldflags reports that version
// from version and --version alike.
func TestBinaryVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(jobbusBin, arg).Output()
		if err != nil || string(out) != "jobbus version "+binVersion+"\n" {
			t.Errorf("jobbus %s: %q, %v", arg, out, err)
		}
	}
}

// serveProc runs `jobbus serve` on dir with random ports and returns it with the URL
// of its NATS server.
func serveProc(t *testing.T, dir string, args ...string) (*proc, string) {
	t.Helper()
	p := startProc(t, nil, append([]string{"serve", "--data-dir", dir, "--nats-listen", "127.0.0.1:-1",
		"--worker-port", "-1", "--client-port", "-1", "--http-listen", "-"}, args...)...)
	url := p.logged(`msg="embedded NATS started" url=(\S+)`)[1]
	p.logged(`msg="coordinator serving"`)
	return p, url
}

func natsConnect(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestServeDrainsOnSIGTERM: serve told to stop lets its local workers finish the running
// job before it stops; run again on the same store, the job is COMPLETED after one
// attempt.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, url := serveProc(t, dir, "--workers", "1", "--shutdown-grace", "30s", "--log-level", "debug")
	cl := client.New(natsConnect(t, url))
	ctx := context.Background()
	id, err := cl.Submit(ctx, "SLEEP", json.RawMessage(`{"durationMillis":500}`))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "job running", func() bool {
		j, err := cl.Status(ctx, id)
		return err == nil && j.State == protocol.StateRunning
	})
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM, want 0", code)
	}
	log := p.stderr.String()
	if n := strings.Count(log, `msg="worker registered"`); n != 1 {
		t.Errorf("%d lines say a worker registered, want 1 for the one local worker:\n%s", n, log)
	}
	if strings.Contains(log, "no workers") {
		t.Errorf("serve --workers 1 says it has no workers:\n%s", log)
	}
	// --log-level debug is jobbus's: its per-job lines, without the NATS server's
	// (those follow --nats-log-level).
	if !strings.Contains(log, `msg="job assigned"`) || strings.Contains(log, "component=nats-server") {
		t.Errorf("serve --log-level debug: want jobbus's job lines and no NATS server lines:\n%s", log)
	}

	again, url := serveProc(t, dir)
	j, err := client.New(natsConnect(t, url)).Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != protocol.StateCompleted || j.Attempts != 1 {
		t.Errorf("after the restart the job is %s after %d attempts, want COMPLETED after 1", j.State, j.Attempts)
	}
	if n := strings.Count(again.stderr.String(), "no workers: jobs wait until a worker connects"); n != 1 {
		t.Errorf("serve without --workers said %d times that it has none, want once:\n%s", n, again.stderr.String())
	}
}

// TestServeOperability: serve's one version reaches the micro service; the opt-in
// monitoring port and system user let the NATS CLI's server reports in.
func TestServeOperability(t *testing.T) {
	t.Parallel()
	p, url := serveProc(t, t.TempDir(), "--nats-http-listen", "127.0.0.1:-1", "--nats-system-password", "s3cret")
	monitor := p.logged(`msg="NATS monitoring" url=(\S+)`)[1]

	nc := natsConnect(t, url) // no credentials: the jobbus account, as before
	msg, err := nc.Request("$SRV.INFO.jobbus", nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info struct{ Version string }
	if err := json.Unmarshal(msg.Data, &info); err != nil || info.Version != binVersion {
		t.Errorf("micro INFO %s: version %q, want %q", msg.Data, info.Version, binVersion)
	}

	sys := natsConnect(t, url, nats.UserInfo("sys", "s3cret"))
	msg, err = sys.Request("$SYS.REQ.SERVER.PING.JSZ", []byte(`{}`), 10*time.Second)
	if err != nil || !strings.Contains(string(msg.Data), `"streams"`) {
		t.Errorf("JetStream report as the system user: %v %s", err, msgData(msg))
	}

	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := hc.Get(monitor + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %s", resp.Status)
	}
}

func msgData(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}
