package cli_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker/tcpworker"
)

// exitLimit bounds how long a command may take to end once stopped (or to finish).
const exitLimit = 20 * time.Second

// running is a CLI command running in-process, in a goroutine, until it ends or stop
// cancels its context. Every long-running command (serve, bridge, worker, bench)
// stops on its context as on SIGINT, so cancelling it is the in-process Ctrl-C.
type running struct {
	out, errs *testkit.Buffer
	cancel    context.CancelFunc
	done      chan struct{}
	code      int
}

// start runs `jobbus <global> <command> <args>`. Like runWatch it holds appMu only until
// the command's action starts (see appMu), so the test may run other commands meanwhile.
func start(t *testing.T, global []string, command string, args ...string) *running {
	t.Helper()
	r := &running{out: &testkit.Buffer{}, errs: &testkit.Buffer{}, done: make(chan struct{})}
	var ctx context.Context
	ctx, r.cancel = context.WithCancel(context.Background())
	appMu.Lock()
	var unlock sync.Once
	app := cli.App(r.out, r.errs)
	for _, cmd := range app.Commands {
		if cmd.Name == command {
			action := cmd.Action
			cmd.Action = func(c *ucli.Context) error {
				unlock.Do(appMu.Unlock)
				return action(c)
			}
		}
	}
	argv := append(append([]string{"jobbus"}, global...), append([]string{command}, args...)...)
	go func() {
		defer close(r.done)
		defer unlock.Do(appMu.Unlock)
		err := app.RunContext(ctx, argv)
		if err != nil {
			fmt.Fprintln(r.errs, "jobbus:", err) // as cli.Run prints it
		}
		r.code = exitCode(err)
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// exitCode is the code cli.Run would return for err: the exit code of an ExitCoder
// (usage errors are ExitCoders), else 1.
func exitCode(err error) int {
	var ec ucli.ExitCoder
	switch {
	case err == nil:
		return cli.ExitOK
	case errors.As(err, &ec):
		return ec.ExitCode()
	}
	return cli.ExitError
}

func (r *running) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// wait waits until the command ends by itself and returns its exit code.
func (r *running) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-r.done:
		return r.code
	case <-time.After(exitLimit):
		t.Fatalf("command still running after %v\nstderr: %s", exitLimit, r.errs)
		return -1
	}
}

// stop cancels the command, as SIGINT would, and returns its exit code.
func (r *running) stop(t *testing.T) int {
	t.Helper()
	r.cancel()
	return r.wait(t)
}

// until polls cond while the command runs, failing the test if the command ends first.
func (r *running) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually(t, what, func() bool {
		if r.exited() {
			t.Fatalf("command exited %d before %s\nstdout: %s\nstderr: %s", r.code, what, r.out, r.errs)
		}
		return cond()
	})
}

// freePorts returns n loopback ports nothing listened on a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close() // all at once, so the n ports differ
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// startOnFreePorts starts a command listening on n free ports (run builds it from
// them) and waits until ready. A port another test took in the meantime makes the
// command exit with "in use": then it starts over on other ports.
func startOnFreePorts(t *testing.T, n int, run func(ports []int) *running, ready func() bool) (*running, []int) {
	t.Helper()
	for try := 1; ; try++ {
		ports := freePorts(t, n)
		r := run(ports)
		eventually(t, "the command to listen", func() bool { return r.exited() || ready() })
		if !r.exited() {
			return r, ports
		}
		if try == 3 || !strings.Contains(r.errs.String(), "in use") {
			t.Fatalf("command exited %d before it was ready\nstdout: %s\nstderr: %s", r.code, r.out, r.errs)
		}
	}
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// listedWorker returns the coordinator's view of worker id, if it is live.
func listedWorker(t *testing.T, c *client.Client, id string) (protocol.Worker, bool) {
	t.Helper()
	ws, err := c.Workers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.WorkerID == id {
			return w, true
		}
	}
	return protocol.Worker{}, false
}

// startWorkerPort serves the bridge's worker port (on a free loopback port) in front of s.
func (s *system) startWorkerPort() string {
	s.t.Helper()
	return s.StartBridge(s.t, func(c *bridge.Config) { c.ClientListen = "" }).WorkerAddr().String()
}

// TestWorkerCommand runs `jobbus worker` both ways, native and as the spec TCP worker
// on a bridge's worker port, and checks a job runs there and the worker leaves when
// the command stops.
func TestWorkerCommand(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args func(s *system) (global, args []string)
	}{
		{"Native", func(s *system) ([]string, []string) {
			return []string{"--nats", s.url}, []string{"--id", "cli-native", "--capacity", "3", "--heartbeat-interval-millis", "40"}
		}},
		{"TCP", func(s *system) ([]string, []string) {
			return nil, []string{"--connect", s.startWorkerPort(), "--id", "cli-tcp", "--capacity", "3", "--reconnect-delay-millis", "20", "--heartbeat-interval-millis", "40"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Far shorter than the default 2 s heartbeat: only the flag keeps the worker.
			const heartbeatTimeout = 400 * time.Millisecond
			s := setup(t, noWorker(), withConfig(func(c *coordinator.Config) { c.HeartbeatTimeout = heartbeatTimeout }))
			global, args := tc.args(s)
			id := args[slices.Index(args, "--id")+1]
			w := start(t, global, "worker", args...)
			c := client.New(s.NC)
			w.until(t, "worker "+id+" listed", func() bool { _, ok := listedWorker(t, c, id); return ok })
			if got, _ := listedWorker(t, c, id); got.Capacity != 3 {
				t.Errorf("worker listed with capacity %d, want 3", got.Capacity)
			}

			// A snapshot names the worker only while the job runs: a long sleep shows it.
			o := over{s, natsTransport}
			sleeping := strings.TrimSpace(first(o.mustRun(cli.ExitOK, "submit", "SLEEP", "--milliseconds", "600000")))
			w.until(t, "the sleep running on "+id, func() bool {
				j, err := c.Status(context.Background(), sleeping)
				return err == nil && j.State == protocol.StateRunning && j.WorkerID != nil && *j.WorkerID == id
			})
			if got, _ := listedWorker(t, c, id); got.ActiveTasks != 1 {
				t.Errorf("worker listed with %d active tasks, want 1", got.ActiveTasks)
			}
			time.Sleep(3 * heartbeatTimeout) // the span observed, not a synchronisation
			if j, err := c.Status(context.Background(), sleeping); err != nil || j.State != protocol.StateRunning || j.Attempts != 1 {
				t.Fatalf("after three heartbeat timeouts: %+v, %v; want still RUNNING its first attempt", j, err)
			}
			o.mustRun(cli.ExitOK, "cancel", sleeping)

			// The worker is the only one: what completes ran there.
			j := jsonJob(t, first(o.mustRun(cli.ExitOK, "submit", "--wait", "--json", "WORD_COUNT", "--text", "one two three")))
			if j.State != protocol.StateCompleted || j.Result == nil || *j.Result != "3" {
				t.Errorf("job %+v, want COMPLETED with 3", j)
			}
			if code := w.stop(t); code != cli.ExitOK {
				t.Errorf("worker exited %d on stop\nstderr: %s", code, w.errs)
			}
			eventually(t, "worker "+id+" gone", func() bool { _, ok := listedWorker(t, c, id); return !ok })
		})
	}
}

var jobsPerSecond = regexp.MustCompile(`(?m)^300 jobs in \S+: \d+ jobs/s \(all submitted after \S+\)$`)

// TestBench runs bench on the in-process system it builds, over both transports.
func TestBench(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"native", "tcp"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			r := start(t, nil, "bench", "--jobs", "300", "--workers", "2", "--worker-capacity", "8", "--submitters", "4", "--transport", transport)
			if code := r.wait(t); code != cli.ExitOK {
				t.Fatalf("bench exited %d\nstdout: %s\nstderr: %s", code, r.out, r.errs)
			}
			out := r.out.String()
			for _, want := range []string{"bench: 300 SHA256 jobs, 4 submitters, transport " + transport + ", sync default",
				"steady rate ", "submit latency p50 ", "submit -> start     p50 ", "submit -> completed p50 "} {
				if !strings.Contains(out, want) {
					t.Errorf("bench output lacks %q:\n%s", want, out)
				}
			}
			if !jobsPerSecond.MatchString(out) {
				t.Errorf("bench output:\n%s", out)
			}
		})
	}
	// The figures in one JSON object: fsync on every write, percentiles under
	// load, the idle run, CPU per job.
	t.Run("JSONIdleSyncAlways", func(t *testing.T) {
		t.Parallel()
		r := start(t, nil, "bench", "--jobs", "40", "--warmup", "5", "--idle", "3", "--sync", "always", "--json",
			"--workers", "1", "--worker-capacity", "8", "--submitters", "4", "--transport", "tcp")
		if code := r.wait(t); code != cli.ExitOK {
			t.Fatalf("bench exited %d\nstdout: %s\nstderr: %s", code, r.out, r.errs)
		}
		var doc struct {
			System   string             `json:"system"`
			Settings map[string]string  `json:"settings"`
			Metrics  map[string]float64 `json:"metrics"`
		}
		if err := json.Unmarshal([]byte(r.out.String()), &doc); err != nil {
			t.Fatalf("not one JSON object: %v\n%s", err, r.out)
		}
		if doc.System != "jobbus" || doc.Settings["sync"] != "always" || doc.Settings["transport"] != "tcp" || doc.Settings["jobs"] != "40" {
			t.Errorf("system %q, settings %v", doc.System, doc.Settings)
		}
		for _, k := range []string{"e2e.jobs_per_s", "e2e.jobs_per_s_after_first_start", "e2e.first_start_ms",
			"e2e.start.p50_ms", "e2e.start.p90_ms", "e2e.start.p99_ms", "e2e.start.max_ms", "e2e.complete.p99_ms",
			"e2e.enqueue_ack.p50_ms", "latency.start.p50_ms", "latency.complete.p50_ms", "latency.complete.p99_ms", "e2e.cpu_ms_per_job", "e2e.peak_rss_mib", "e2e.nats_msgs_per_job"} {
			if v, ok := doc.Metrics[k]; !ok || v <= 0 {
				t.Errorf("metric %s = %v (present %v)", k, v, ok)
			}
		}
		// A job takes at least its submission and reply and its two writes and their
		// acknowledgements, each in to the server and out of it again.
		if n := doc.Metrics["e2e.nats_msgs_per_job"]; n < 4 {
			t.Errorf("%.1f NATS messages a job: fewer than a job's submission and writes", n)
		}
		if p50, p99 := doc.Metrics["latency.complete.p50_ms"], doc.Metrics["latency.complete.p99_ms"]; p50 > p99 {
			t.Errorf("idle p50 %v above p99 %v", p50, p99)
		}
	})
	// A handler reporting progress 10,000 times a second beside the measured jobs: its
	// record is written a few times a second (coalesced), whatever it reports.
	t.Run("ProgressFloodIsCoalesced", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		r := start(t, nil, "bench", "--data-dir", dir, "--jobs", "500", "--json", "--workers", "1", "--worker-capacity", "8", "--submitters", "4",
			"--progress-flood", "1", "--progress-rate", "2000")
		if code := r.wait(t); code != cli.ExitOK {
			t.Fatalf("bench exited %d\nstdout: %s\nstderr: %s", code, r.out, r.errs)
		}
		var doc struct {
			Metrics map[string]float64 `json:"metrics"`
		}
		if err := json.Unmarshal([]byte(r.out.String()), &doc); err != nil {
			t.Fatalf("not one JSON object: %v\n%s", err, r.out)
		}
		// Progress is written at most every 250 ms: 4 a second, and one more at each
		// end of the measured run.
		reports, writes, secs := doc.Metrics["flood.reports_per_s"], doc.Metrics["flood.record_writes_per_s"], doc.Metrics["e2e.seconds"]
		if reports < 500 || secs <= 0 || writes*secs > 4*secs+3 {
			t.Errorf("flood job: %.0f reports/s, its record written %.1f/s over %.2fs; want >= 500 reports a second and at most 4 writes a second (+3)", reports, writes, secs)
		}
		// The flood job, stopped at the end of the measured run, ended before bench
		// stopped its system: its result was taken, not retried at a coordinator gone.
		if flood := storedRecordsOf(t, dir, "BENCH_PROGRESS_FLOOD"); len(flood) != 1 || flood[0].State != protocol.StateCompleted {
			t.Errorf("flood jobs in the store bench left: %+v, want one COMPLETED", flood)
		}
	})
	// Jobs submitted many at a time (SubmitMany) all run, and are all stored: a second
	// run on the same store starts with them.
	t.Run("SubmitMany", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		r := start(t, nil, "bench", "--data-dir", dir, "--jobs", "100", "--warmup", "5", "--submit-many", "16", "--workers", "1", "--worker-capacity", "4", "--submitters", "2")
		if code := r.wait(t); code != cli.ExitOK || !strings.Contains(r.out.String(), "100 jobs in") {
			t.Fatalf("bench exited %d\nstdout: %s\nstderr: %s", code, r.out, r.errs)
		}
		r = start(t, nil, "bench", "--data-dir", dir, "--jobs", "1", "--workers", "1", "--worker-capacity", "1", "--submitters", "1")
		if code := r.wait(t); code != cli.ExitOK || !strings.Contains(r.out.String(), "held 105 jobs at start") {
			t.Fatalf("second run exited %d, want it to start with the 105 jobs\nstdout: %s\nstderr: %s", code, r.out, r.errs)
		}
		r = start(t, nil, "bench", "--jobs", "1", "--submit-many", "257")
		if code := r.wait(t); code != cli.ExitUsage || !strings.Contains(r.errs.String(), "--submit-many must be between 0 and 256") {
			t.Fatalf("--submit-many 257: exit %d, stderr %s", code, r.errs)
		}
	})
	// A store of its own, kept: the second run starts with the first one's jobs.
	t.Run("DataDir", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		for i, want := range []string{"held 0 jobs at start", "held 35 jobs at start"} {
			r := start(t, nil, "bench", "--data-dir", dir, "--jobs", "30", "--warmup", "5", "--workers", "1", "--worker-capacity", "4", "--submitters", "2")
			if code := r.wait(t); code != cli.ExitOK {
				t.Fatalf("run %d: bench exited %d\nstdout: %s\nstderr: %s", i+1, code, r.out, r.errs)
			}
			if out := r.out.String(); !strings.Contains(out, "bench: store "+dir+" "+want) {
				t.Errorf("run %d: bench output lacks %q:\n%s", i+1, want, out)
			}
		}
	})
	t.Run("BogusTransport", func(t *testing.T) {
		t.Parallel()
		code, _, errs := cliRun(nil, "bench", "--transport", "bogus")
		if code != cli.ExitUsage || !strings.Contains(errs, `--transport must be native or tcp, got "bogus"`) {
			t.Errorf("exit %d, stderr %q", code, errs)
		}
	})
}

// TestBridgeCommand runs a standalone bridge in front of a coordinator on NATS: a
// client reaches it over --connect, a native worker runs the job, and a spec worker
// registers through its worker port.
func TestBridgeCommand(t *testing.T) {
	t.Parallel()
	s := setup(t, noWorker())
	native, _ := s.startWorker()
	var clientAddr string
	b, ports := startOnFreePorts(t, 2, func(p []int) *running {
		clientAddr = hostPort(p[1])
		return start(t, []string{"--nats", s.url}, "bridge", "--worker-port", strconv.Itoa(p[0]), "--client-port", strconv.Itoa(p[1]))
	}, func() bool {
		code, _, _ := cliRun([]string{"--connect", clientAddr}, "workers")
		return code == cli.ExitOK
	})
	tcp := over{s, transport{"TCP", func(*system) {}, func(*system) []string { return []string{"--connect", clientAddr} }}}

	sum := sha256.Sum256([]byte("bridged"))
	out, _ := tcp.mustRun(cli.ExitOK, "submit", "--wait", "--json", "SHA256", "--text", "bridged")
	if j := jsonJob(t, out); j.State != protocol.StateCompleted || *j.Result != hex.EncodeToString(sum[:]) {
		t.Errorf("job %+v, want COMPLETED by the only worker, %s", j, native)
	}

	w, err := tcpworker.New(hostPort(ports[0]), tcpworker.WithID("edge"), tcpworker.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	jobbustest.Go(t, w.Run) // until the test ends
	b.until(t, "edge listed", func() bool {
		out, _ := tcp.mustRun(cli.ExitOK, "workers", "--json")
		return strings.Contains(out, `"workerId":"edge"`)
	})

	if code := b.stop(t); code != cli.ExitOK {
		t.Errorf("bridge exited %d on stop\nstderr: %s", code, b.errs)
	}
	if code, _, errs := cliRun([]string{"--connect", clientAddr}, "workers"); code != cli.ExitError || !strings.Contains(errs, "cannot reach the jobbus client port") {
		t.Errorf("client port still served after stop: exit %d, stderr %q", code, errs)
	}
}

// TestServeKeepsJobsAcrossRestarts runs the whole system with `serve`, submits over
// NATS and over the TCP client port, stops it, starts it again on the same data
// directory and finds the completed jobs there.
func TestServeKeepsJobsAcrossRestarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var natsFlags, tcpFlags []string
	serve := func() *running {
		r, _ := startOnFreePorts(t, 3, func(p []int) *running {
			natsFlags = []string{"--nats", fmt.Sprintf("nats://%s", hostPort(p[0]))}
			tcpFlags = []string{"--connect", hostPort(p[2])}
			return start(t, nil, "serve", "--data-dir", dir, "--nats-listen", hostPort(p[0]),
				"--worker-port", strconv.Itoa(p[1]), "--client-port", strconv.Itoa(p[2]), "--workers", "1", "--http-listen", "127.0.0.1:0",
				"--leader-lease-millis", "1500", "--heartbeat-timeout-millis", "300")
		}, func() bool {
			// Up once the coordinator leads and the local worker registered.
			code, out, _ := cliRun(natsFlags, "workers", "--json")
			return code == cli.ExitOK && strings.Count(out, `"workerId"`) == 1
		})
		return r
	}
	run := func(global []string, args ...string) string {
		t.Helper()
		code, out, errs := cliRun(global, args...)
		if code != cli.ExitOK {
			t.Fatalf("jobbus %s: exit %d\nstderr: %s", strings.Join(args, " "), code, errs)
		}
		return out
	}

	r := serve()
	viaNATS := jsonJob(t, run(natsFlags, "submit", "--wait", "--json", "PRIME_COUNT", "--limit", "100"))
	viaTCP := jsonJob(t, run(tcpFlags, "submit", "--wait", "--json", "WORD_COUNT", "--text", "kept across restarts"))
	// Local workers beat fast enough for a heartbeat timeout far below their default
	// 2 s: a sleep three timeouts long finishes on its first attempt.
	slept := jsonJob(t, run(natsFlags, "submit", "--wait", "--json", "SLEEP", "--milliseconds", "900"))
	for _, j := range []protocol.Job{viaNATS, viaTCP, slept} {
		if j.State != protocol.StateCompleted || j.Attempts != 1 {
			t.Fatalf("job %+v, want COMPLETED on attempt 1", j)
		}
	}
	if code := r.stop(t); code != cli.ExitOK {
		t.Fatalf("serve exited %d on stop\nstderr: %s", code, r.errs)
	}

	r = serve()
	for _, want := range []protocol.Job{viaNATS, viaTCP} {
		for _, global := range [][]string{natsFlags, tcpFlags} {
			got := jsonJob(t, run(global, "status", "--json", want.JobID))
			if got.State != protocol.StateCompleted || *got.Result != *want.Result || got.UpdatedAtMillis != want.UpdatedAtMillis {
				t.Errorf("after restart (%s): %+v, want %+v", global[0], got, want)
			}
		}
	}
	if code := r.stop(t); code != cli.ExitOK {
		t.Errorf("serve exited %d on the second stop\nstderr: %s", code, r.errs)
	}
}
