package cli_test

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tasks"
)

// A recording worker is this test binary run as a native worker process (TestMain sees
// recorderEnv): its one task type, RECORDED, sleeps and writes a line to a file shared
// by every recording worker when each execution starts and ends, so that a test can
// see every execution of a job, and whether two overlapped, whatever the coordinator
// believes.
const (
	recorderEnv     = "JOBBUS_TEST_RECORDING_WORKER" // the record file
	recorderNATSEnv = "JOBBUS_TEST_RECORDING_NATS"
	recorderIDEnv   = "JOBBUS_TEST_RECORDING_ID"
	// recorderQueuesEnv, if set, is the worker's queues as jobbus worker --queues
	// takes them; else it serves the default queue.
	recorderQueuesEnv = "JOBBUS_TEST_RECORDING_QUEUES"
)

// recorded is RECORDED's payload: Key names the job in the record.
type recorded struct {
	Key    string `json:"key"`
	Millis int    `json:"millis"`
}

// runRecordingWorker runs the recording worker until SIGTERM or SIGINT and returns its
// exit code.
func runRecordingWorker() int {
	f, err := os.OpenFile(os.Getenv(recorderEnv), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "recording worker:", err)
		return 1
	}
	defer f.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	queues, err := protocol.ParseQueueWeights(cmp.Or(os.Getenv(recorderQueuesEnv), protocol.DefaultQueue))
	if err != nil {
		fmt.Fprintln(os.Stderr, "recording worker:", err)
		return 1
	}
	// As jobbus worker connects: reconnect forever, find a dead server within seconds.
	w, err := worker.Connect(ctx, os.Getenv(recorderNATSEnv), worker.WithID(os.Getenv(recorderIDEnv)),
		worker.WithCapacity(4), worker.WithHeartbeat(500*time.Millisecond), worker.WithTasks(tasks.NewRegistry()),
		worker.WithQueues(queues...), worker.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))),
		worker.WithBusOptions(bus.WithNATSOptions(embeddednats.ServiceOptions()...)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "recording worker:", err)
		return 1
	}
	defer w.Close()
	pid := os.Getpid()
	// One write per line, O_APPEND: lines of several processes never interleave.
	note := func(what, key string, attempt int) {
		_, _ = fmt.Fprintf(f, "%s %s %d %d %d\n", what, key, attempt, pid, time.Now().UnixNano())
	}
	err = worker.HandleJSON(w, "RECORDED", func(ctx context.Context, attempt int, r recorded) (string, error) {
		note("start", r.Key, attempt)
		defer note("end", r.Key, attempt)
		t := time.NewTimer(time.Duration(r.Millis) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
			return "ran " + r.Key, nil
		case <-ctx.Done():
			return "", context.Cause(ctx)
		}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "recording worker:", err)
		return 1
	}
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "recording worker:", err)
		return 1
	}
	return 0
}

// execution is one run of a RECORDED job, from the record.
type execution struct {
	attempt    int
	pid        int
	start, end int64 // Unix nanoseconds; end 0: still running, or its process died
}

// readRecord reads the record file: every job's executions by key, in start order.
func readRecord(t *testing.T, path string) map[string][]execution {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := make(map[string][]execution)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var what, key string
		var attempt, pid int
		var at int64
		if _, err := fmt.Sscanf(sc.Text(), "%s %s %d %d %d", &what, &key, &attempt, &pid, &at); err != nil {
			t.Fatalf("record line %q: %v", sc.Text(), err)
		}
		switch what {
		case "start":
			out[key] = append(out[key], execution{attempt: attempt, pid: pid, start: at})
		case "end":
			es := out[key]
			for i := len(es) - 1; i >= 0; i-- {
				if es[i].pid == pid && es[i].attempt == attempt && es[i].end == 0 {
					es[i].end = at
					break
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// overlaps counts the pairs of a job's executions that ran at the same time (an
// execution that never ended runs until the end of time).
func overlaps(es []execution) int {
	n := 0
	for i := range es {
		for k := i + 1; k < len(es); k++ {
			endI, endK := es[i].end, es[k].end
			if endI == 0 {
				endI = 1<<63 - 1
			}
			if endK == 0 {
				endK = 1<<63 - 1
			}
			if es[i].start < endK && es[k].start < endI {
				n++
			}
		}
	}
	return n
}

// startRecordingWorker runs a recording worker process against url until the test ends,
// with env added to its environment.
func startRecordingWorker(t *testing.T, url, id, record string, env ...string) *proc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return startCommand(t, "recording worker "+id, exec.Command(self),
		append([]string{recorderEnv + "=" + record, recorderNATSEnv + "=" + url, recorderIDEnv + "=" + id}, env...))
}

// TestServeKilledCostsNativeWorkersNoAttempt is issue 21's restart row as a test: jobbus
// serve is SIGKILLed and started again on its store, again and again, while native
// worker processes outside it run jobs, half of them on their only attempt (max
// attempts 1), half with three. A worker reports what it runs when it registers with
// the new coordinator, which keeps those attempts: every job completes on attempt 1,
// none fails, and no job ever runs twice at once (the workers record each execution's
// start and end). JOBBUS_LONG_TESTS=1 (task
// test-restarts) kills serve more often.
func TestServeKilledCostsNativeWorkersNoAttempt(t *testing.T) {
	t.Parallel()
	kills := 2
	if os.Getenv("JOBBUS_LONG_TESTS") != "" {
		kills = 12
	}
	dir, record := t.TempDir(), filepath.Join(t.TempDir(), "record")
	port := freePorts(t, 1)[0]
	url := "nats://" + hostPort(port)
	startServe := func() *proc {
		p := startProc(t, nil, "serve", "--data-dir", dir, "--nats-listen", hostPort(port), "--worker-port", "-1",
			"--client-port", "-1", "--http-listen", "-", "--heartbeat-timeout-millis", "2000")
		p.logged(`msg="coordinator serving"`)
		return p
	}
	serve := startServe()
	for i := range 2 {
		startRecordingWorker(t, url, "recorder-"+strconv.Itoa(i), record)
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl := client.New(nc)
	eventually(t, "2 recording workers listed", func() bool {
		ws, err := cl.Workers(context.Background())
		return err == nil && len(ws) == 2
	})

	// Submitters: jobs of 0.3-2 s, about as many as the workers' 8 slots, so that every
	// kill finds attempts running, some of them just assigned or just finishing.
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu       sync.Mutex
		accepted = make(map[string]string) // job id -> key
		wg       sync.WaitGroup
	)
	for i := range 2 {
		wg.Go(func() {
			for k := 0; ctx.Err() == nil; k++ {
				key := fmt.Sprintf("s%d-%d", i, k)
				sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
				// Half on their only attempt, where a lost attempt fails the job; half with
				// three, where a lost one runs again (beside the first, if that still runs).
				id, err := cl.Submit(sctx, "RECORDED", recorded{Key: key, Millis: 300 + rand.IntN(1700)}, client.MaxAttempts(1+2*(k%2)))
				scancel()
				if err == nil {
					mu.Lock()
					accepted[id] = key
					mu.Unlock()
				}
				time.Sleep(250 * time.Millisecond)
			}
		})
	}
	runningAtKills := 0
	for range kills {
		var running int
		testkit.Eventually(t, 30*time.Second, "attempts running", func() bool {
			page, err := cl.List(context.Background(), protocol.ListJobs{State: ptrTo(protocol.StateRunning)})
			running = len(page.Jobs)
			return err == nil && running >= 3
		})
		serve.signal(syscall.SIGKILL)
		<-serve.done
		runningAtKills += running
		serve = startServe()
		time.Sleep(time.Duration(1500+rand.IntN(1500)) * time.Millisecond)
	}
	cancel()
	wg.Wait()

	wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer wcancel()
	lost := 0
	for id := range accepted {
		j, err := cl.Wait(wctx, id)
		if err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
		if j.State != protocol.StateCompleted || j.Attempts != 1 {
			lost++
			if lost <= 5 {
				t.Errorf("job %s (%s) ended %s after %d attempts: %s", id, accepted[id], j.State, j.Attempts, deref(j.Error))
			}
		}
	}
	execs := readRecord(t, record)
	overlapping, again := 0, 0
	for id, key := range accepted {
		es := execs[key]
		if n := overlaps(es); n > 0 {
			overlapping += n
			t.Errorf("job %s (%s) ran %d times at once: %+v", id, key, n+1, es)
		}
		if len(es) > 1 {
			again += len(es) - 1
		}
		if !slices.ContainsFunc(es, func(e execution) bool { return e.end != 0 }) {
			t.Errorf("job %s (%s) has no finished execution: %+v", id, key, es)
		}
	}
	t.Logf("serve SIGKILLed %d times with %d attempts running at the kills; %d jobs accepted; attempts lost %d; overlapping executions %d; executions beyond a job's first %d",
		kills, runningAtKills, len(accepted), lost, overlapping, again)
	if len(accepted) == 0 {
		t.Fatal("no job accepted")
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestTCPWorkerStopsItsTaskWhenItsConnectionDrops: jobbus worker --connect runs a job
// on serve's worker port; serve is SIGKILLed. The attempt is void with the connection
// (PROTOCOL.md), so the worker stops the task at once rather than run it beside the
// retry: its log says so before serve is even back. Back, serve counts the void
// attempt as soon as the worker registers again on a new connection (which holds
// nothing), and the job completes on its second attempt.
func TestTCPWorkerStopsItsTaskWhenItsConnectionDrops(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ports := freePorts(t, 2)
	url := "nats://" + hostPort(ports[0])
	startServe := func() *proc {
		p := startProc(t, nil, "serve", "--data-dir", dir, "--nats-listen", hostPort(ports[0]),
			"--worker-port", strconv.Itoa(ports[1]), "--client-port", "-1", "--http-listen", "-")
		p.logged(`msg="coordinator serving"`)
		return p
	}
	serve := startServe()
	w := startProc(t, nil, "worker", "--connect", hostPort(ports[1]), "--id", "tcp-1", "--log-level", "debug",
		"--reconnect-delay-millis", "100")
	w.logged(`msg="worker registered"`)
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl := client.New(nc)
	ctx := context.Background()
	id, err := cl.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 3000}, client.MaxAttempts(2))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the job running", func() bool {
		j, err := cl.Status(ctx, id)
		return err == nil && j.State == protocol.StateRunning
	})
	serve.signal(syscall.SIGKILL)
	<-serve.done
	w.logged(`msg="attempt interrupted: result dropped" .*job=` + id)
	startServe()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	j, err := cl.Wait(wctx, id)
	if err != nil || j.State != protocol.StateCompleted || j.Attempts != 2 {
		t.Fatalf("job %+v (%v), want COMPLETED on attempt 2: the first was void with its connection", j, err)
	}
}
