package cli_test

import (
	"context"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/internal/testkit/specpeer"
)

// Faults on a running job's worker side, with real processes: the worker frozen
// (SIGSTOP) for less and for more than the heartbeat timeout, the bridge of a spec
// worker restarted, serve restarted behind a bridge, the leader failing over.

// faultServe is jobbus serve on its own store with a heartbeat timeout of
// timeoutMillis, a sweep every 50 ms and retries after 100 ms; start starts it again
// on the same store and ports.
type faultServe struct {
	t                    *testing.T
	dir                  string
	natsPort, workerPort int
	timeoutMillis        int
	url                  string
	proc                 *proc
}

// startFaultServe starts a faultServe with its worker port on, or off (the workers then
// use a bridge of their own), and returns it with a client.
func startFaultServe(t *testing.T, timeoutMillis int, workerPort bool) (*faultServe, *client.Client) {
	t.Helper()
	ports := freePorts(t, 2)
	f := &faultServe{t: t, dir: t.TempDir(), natsPort: ports[0], workerPort: ports[1], timeoutMillis: timeoutMillis,
		url: "nats://" + hostPort(ports[0])}
	if !workerPort {
		f.workerPort = -1
	}
	f.start()
	return f, client.New(reconnecting(t, f.url))
}

func (f *faultServe) start() {
	f.t.Helper()
	f.proc = startProc(f.t, nil, "serve", "--data-dir", f.dir, "--nats-listen", hostPort(f.natsPort),
		"--worker-port", strconv.Itoa(f.workerPort), "--client-port", "-1", "--http-listen", "-",
		"--heartbeat-timeout-millis", strconv.Itoa(f.timeoutMillis), "--sweep-interval-millis", "50",
		"--retry-base-delay-millis", "100")
	f.proc.logged(`msg="coordinator serving"`)
}

// kill SIGKILLs serve and waits until it is gone.
func (f *faultServe) kill() {
	f.proc.signal(syscall.SIGKILL)
	<-f.proc.done
}

// runningOn waits until job id runs, and returns the worker running it.
func runningOn(t *testing.T, cl *client.Client, id string) string {
	t.Helper()
	var j protocol.Job
	eventually(t, "job "+id+" running", func() bool {
		var err error
		j, err = cl.Status(context.Background(), id)
		return err == nil && j.State == protocol.StateRunning && j.WorkerID != nil
	})
	return *j.WorkerID
}

// finished waits until job id has ended, and returns it.
func finished(t *testing.T, cl *client.Client, id string) protocol.Job {
	t.Helper()
	var j protocol.Job
	testkit.Eventually(t, 30*time.Second, "job "+id+" finished", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var err error
		j, err = cl.Status(ctx, id)
		return err == nil && j.State.Terminal()
	})
	return j
}

// TestPausedNativeWorkerKeepsItsAttempt: a native worker process is frozen (SIGSTOP)
// for half the heartbeat timeout while it runs a job's only attempt that outlasts the
// pause. The coordinator never misses it long enough to lose it: the job completes on
// its one attempt, run once, and its result is that execution's.
func TestPausedNativeWorkerKeepsItsAttempt(t *testing.T) {
	t.Parallel()
	f, cl := startFaultServe(t, 3000, false)
	url := f.url
	record := filepath.Join(t.TempDir(), "record")
	w := startRecordingWorker(t, url, "paused", record)
	eventually(t, "worker listed", func() bool {
		ws, err := cl.Workers(context.Background())
		return err == nil && len(ws) == 1
	})
	id, err := cl.Submit(context.Background(), "RECORDED", recorded{Key: "k", Millis: 2500}, client.MaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	runningOn(t, cl, id)
	w.signal(syscall.SIGSTOP)
	time.Sleep(1500 * time.Millisecond) // the fault itself, not a wait for anything
	w.signal(syscall.SIGCONT)

	j := finished(t, cl, id)
	if j.State != protocol.StateCompleted || j.Attempts != 1 || deref(j.Result) != "ran k" {
		t.Fatalf("job %s: %s after %d attempts, result %q, error %q: want COMPLETED on its one attempt",
			id, j.State, j.Attempts, deref(j.Result), deref(j.Error))
	}
	if es := readRecord(t, record)["k"]; len(es) != 1 || es[0].end == 0 {
		t.Fatalf("executions %+v, want one, finished", es)
	}
}

// TestNativeWorkerPausedPastTimeout: a native worker process is frozen for twice the
// heartbeat timeout while it runs a job's first attempt. The coordinator loses it (the
// attempt counts, PROTOCOL.md) and another worker runs the job's second attempt, whose
// result is the job's. Thawed, the frozen worker learns that it was forgotten,
// registers again and stops the attempt it lost; its late result, if it sends one,
// changes nothing.
func TestNativeWorkerPausedPastTimeout(t *testing.T) {
	t.Parallel()
	f, cl := startFaultServe(t, 1500, false)
	url := f.url
	record := filepath.Join(t.TempDir(), "record")
	ws := map[string]*proc{}
	for _, name := range []string{"a", "b"} {
		ws[name] = startRecordingWorker(t, url, name, record)
	}
	eventually(t, "workers listed", func() bool {
		ws, err := cl.Workers(context.Background())
		return err == nil && len(ws) == 2
	})
	id, err := cl.Submit(context.Background(), "RECORDED", recorded{Key: "k", Millis: 6000}, client.MaxAttempts(2))
	if err != nil {
		t.Fatal(err)
	}
	frozen := runningOn(t, cl, id)
	first := func() (execution, bool) { // attempt 1's execution, on the frozen worker
		for _, e := range readRecord(t, record)["k"] {
			if e.attempt == 1 {
				return e, true
			}
		}
		return execution{}, false
	}
	eventually(t, "attempt 1 executing", func() bool { _, ok := first(); return ok })
	ws[frozen].signal(syscall.SIGSTOP)
	var j protocol.Job
	eventually(t, "the job on another worker", func() bool {
		j, err = cl.Status(context.Background(), id)
		return err == nil && j.State == protocol.StateRunning && j.WorkerID != nil && *j.WorkerID != frozen
	})
	ws[frozen].signal(syscall.SIGCONT)
	thawed := time.Now()

	eventually(t, "the frozen worker's execution stopped", func() bool { e, _ := first(); return e.end != 0 })
	if e, _ := first(); time.Duration(e.end-thawed.UnixNano()) > 3*time.Second {
		t.Errorf("the frozen worker stopped its lost attempt %v after it was thawed, want well before it would end (6 s)",
			time.Duration(e.end-thawed.UnixNano()))
	}
	j = finished(t, cl, id)
	if j.State != protocol.StateCompleted || j.Attempts != 2 || deref(j.Result) != "ran k" || deref(j.LastWorkerID) == frozen {
		t.Fatalf("job %s: %s after %d attempts on %s, result %q: want COMPLETED on attempt 2, not on %s",
			id, j.State, j.Attempts, deref(j.LastWorkerID), deref(j.Result), frozen)
	}
	eventually(t, "the frozen worker registered again", func() bool {
		ws, err := cl.Workers(context.Background())
		return err == nil && len(ws) == 2
	})
	if es := readRecord(t, record)["k"]; len(es) != 2 {
		t.Fatalf("executions %+v, want attempt 1 (lost) and 2", es)
	}
}

// startTCPWorker runs jobbus worker --connect against a worker port, heartbeating
// every 200 ms and dialling again 50 ms after a lost connection, and waits until it
// registered.
func startTCPWorker(t *testing.T, workerPort int, id string) *proc {
	t.Helper()
	w := startProc(t, nil, "worker", "--connect", hostPort(workerPort), "--id", id, "--log-level", "debug",
		"--heartbeat-interval-millis", "200", "--reconnect-delay-millis", "50")
	w.logged(`msg="worker registered"`)
	return w
}

// sleepJob submits a SLEEP of ms with maxAttempts.
func sleepJob(t *testing.T, cl *client.Client, ms, maxAttempts int) string {
	t.Helper()
	id, err := cl.Submit(context.Background(), "SLEEP", map[string]int{"durationMillis": ms}, client.MaxAttempts(maxAttempts))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestPausedTCPWorkerKeepsItsAttempt: a spec TCP worker (jobbus worker --connect) is
// frozen for half the heartbeat timeout while it runs a job's only attempt. Its
// connection to the bridge stays open and the coordinator never loses it: the job
// completes on its one attempt.
func TestPausedTCPWorkerKeepsItsAttempt(t *testing.T) {
	t.Parallel()
	f, cl := startFaultServe(t, 3000, true)
	w := startTCPWorker(t, f.workerPort, "tcp-paused")
	id := sleepJob(t, cl, 2500, 1)
	runningOn(t, cl, id)
	w.signal(syscall.SIGSTOP)
	time.Sleep(1500 * time.Millisecond) // the fault itself, not a wait for anything
	w.signal(syscall.SIGCONT)
	j := finished(t, cl, id)
	if j.State != protocol.StateCompleted || j.Attempts != 1 || deref(j.Result) != "slept 2500 ms" {
		t.Fatalf("job %s: %s after %d attempts, result %q, error %q: want COMPLETED on its one attempt",
			id, j.State, j.Attempts, deref(j.Result), deref(j.Error))
	}
}

// TestTCPWorkerPausedPastTimeout: the only worker, a spec TCP worker, is frozen for
// twice the heartbeat timeout while it runs a job's first attempt; its connection to
// the bridge stays open. The coordinator loses it (the attempt counts). Thawed, the
// worker heartbeats, the bridge registers it again, reporting the attempt it still
// runs, which the coordinator cancels; the job's second attempt runs on the same
// worker and its result is the job's.
func TestTCPWorkerPausedPastTimeout(t *testing.T) {
	t.Parallel()
	f, cl := startFaultServe(t, 1000, true)
	w := startTCPWorker(t, f.workerPort, "tcp-frozen")
	id := sleepJob(t, cl, 5000, 2)
	runningOn(t, cl, id)
	w.signal(syscall.SIGSTOP)
	eventually(t, "the frozen worker lost", func() bool {
		j, err := cl.Status(context.Background(), id)
		return err == nil && j.State != protocol.StateRunning
	})
	w.signal(syscall.SIGCONT)
	w.logged(`msg="attempt finished" .*success=false err="?attempt cancelled`)
	j := finished(t, cl, id)
	if j.State != protocol.StateCompleted || j.Attempts != 2 || deref(j.Result) != "slept 5000 ms" {
		t.Fatalf("job %s: %s after %d attempts, result %q, error %q: want COMPLETED on attempt 2",
			id, j.State, j.Attempts, deref(j.Result), deref(j.Error))
	}
}

// startBridge runs jobbus bridge for the coordinator on url, its worker port on
// workerPort (its client port off), and waits until it serves. Not by dialling the
// port: the bridge's check that its ports are free listens on them for a moment.
func startBridge(t *testing.T, url string, workerPort int) *proc {
	t.Helper()
	p := startProc(t, nil, "--nats", url, "bridge", "--worker-port", strconv.Itoa(workerPort), "--client-port", "-1")
	p.logged(`msg="bridge running"`)
	return p
}

// TestBridgeRestartVoidsTCPWorkersAttempt: the bridge a spec worker is connected to is
// SIGKILLed and started again; the worker dials again and registers. Its attempt
// ended with its connection (PROTOCOL.md: the bridge reports a new connection holding
// nothing), so the result it sends for it on the new connection is stale; the job's
// second attempt runs on the new connection, and its result is the job's.
func TestBridgeRestartVoidsTCPWorkersAttempt(t *testing.T) {
	t.Parallel()
	f, cl := startFaultServe(t, 5000, false)
	port := freePorts(t, 1)[0]
	br := startBridge(t, f.url, port)
	w := specpeer.Dial(t, hostPort(port))
	w.Register("spec-1", 1)
	id := sleepJob(t, cl, 60_000, 2)
	a1 := w.ExpectAssign(id)

	br.signal(syscall.SIGKILL)
	<-br.done
	startBridge(t, f.url, port)
	w = specpeer.Dial(t, hostPort(port))
	w.Register("spec-1", 1)
	w.MustSend(&protocol.TaskResult{WorkerID: "spec-1", JobID: id, AttemptID: a1.AttemptID, Success: true, Result: ptrTo("stale")})
	a2 := w.ExpectAssign(id)
	if a2.AttemptNumber != 2 || a2.AttemptID == a1.AttemptID {
		t.Fatalf("assignment %+v after %+v, want attempt 2", a2, a1)
	}
	w.MustSend(&protocol.TaskResult{WorkerID: "spec-1", JobID: id, AttemptID: a2.AttemptID, Success: true, Result: ptrTo("fresh")})
	j := finished(t, cl, id)
	if j.State != protocol.StateCompleted || j.Attempts != 2 || deref(j.Result) != "fresh" {
		t.Fatalf("job %s: %s after %d attempts, result %q, error %q: want COMPLETED on attempt 2 with its result",
			id, j.State, j.Attempts, deref(j.Result), deref(j.Error))
	}
}

// TestServeRestartBehindBridgeCostsTCPWorkerNothing: a spec worker's connection goes to
// a bridge of its own, which stays up while jobbus serve (the coordinator and the NATS
// server) is SIGKILLed and started again on its store. The worker's connection never
// ended, so its attempt goes on: the bridge claims it for the worker with the new
// coordinator, and the job completes on its only attempt, with the worker's result
// sent before the claim (while serve is down) or after it.
func TestServeRestartBehindBridgeCostsTCPWorkerNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		resultEarly bool
	}{{"ResultWhileDown", true}, {"ResultAfterClaim", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, cl := startFaultServe(t, 1000, false)
			port := freePorts(t, 1)[0]
			startBridge(t, f.url, port)
			w := specpeer.Dial(t, hostPort(port))
			w.Register("spec-1", 1)
			heartbeating(t, w, "spec-1")
			id := sleepJob(t, cl, 60_000, 1)
			a := w.ExpectAssign(id)

			f.kill()
			result := &protocol.TaskResult{WorkerID: "spec-1", JobID: id, AttemptID: a.AttemptID, Success: true, Result: ptrTo("done")}
			if tc.resultEarly {
				w.MustSend(result)
			}
			f.start()
			if !tc.resultEarly {
				eventually(t, "the worker's attempt claimed", func() bool {
					ws, err := cl.Workers(context.Background())
					return err == nil && len(ws) == 1 && ws[0].ActiveTasks == 1
				})
				w.MustSend(result)
			}
			j := finished(t, cl, id)
			if j.State != protocol.StateCompleted || j.Attempts != 1 || deref(j.Result) != "done" {
				t.Fatalf("job %s: %s after %d attempts, result %q, error %q: want COMPLETED on its one attempt",
					id, j.State, j.Attempts, deref(j.Result), deref(j.Error))
			}
		})
	}
}

// heartbeating sends HEARTBEAT for id on w every 100 ms until the test ends, as a spec
// worker does.
func heartbeating(t *testing.T, w *specpeer.Peer, id string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = w.Send(&protocol.Heartbeat{WorkerID: id})
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// TestFailoverCostsRunningAttemptsNothing: two jobbus coordinator processes, the leader
// SIGKILLed, or SIGSTOPped past its lease and let go on once the standby leads, while
// a native worker process and a spec TCP worker behind jobbus bridge each run a job's
// only attempt. Each worker claims its attempt with the new leader (the bridge for
// its TCP worker): both jobs complete on their one attempt, the native one run once.
func TestFailoverCostsRunningAttemptsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		pause bool
	}{{"Killed", false}, {"Paused", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startNATS(t)
			leader, standby := s.leaderAndStandby("--leader-lease-millis", "1000", "--heartbeat-timeout-millis", "1000",
				"--sweep-interval-millis", "50")
			record := filepath.Join(t.TempDir(), "record")
			startRecordingWorker(t, s.url, "native", record) // RECORDED only
			port := freePorts(t, 1)[0]
			startBridge(t, s.url, port)
			startTCPWorker(t, port, "tcp") // the built-ins: SLEEP
			cl := client.New(s.NC)
			eventually(t, "workers listed", func() bool {
				ws, err := cl.Workers(context.Background())
				return err == nil && len(ws) == 2
			})
			native, err := cl.Submit(context.Background(), "RECORDED", recorded{Key: "k", Millis: 4000}, client.MaxAttempts(1))
			if err != nil {
				t.Fatal(err)
			}
			tcp := sleepJob(t, cl, 4000, 1)
			runningOn(t, cl, native)
			runningOn(t, cl, tcp)
			if tc.pause {
				leader.signal(syscall.SIGSTOP)
			} else {
				leader.signal(syscall.SIGKILL)
			}
			standby.logged(`msg="coordinator serving"`)
			if tc.pause {
				leader.signal(syscall.SIGCONT) // deposed: it must change nothing now
			}
			for _, id := range []string{native, tcp} {
				if j := finished(t, cl, id); j.State != protocol.StateCompleted || j.Attempts != 1 {
					t.Errorf("job %s: %s after %d attempts, result %q, error %q: want COMPLETED on its one attempt",
						id, j.State, j.Attempts, deref(j.Result), deref(j.Error))
				}
			}
			if es := readRecord(t, record)["k"]; len(es) != 1 || es[0].end == 0 {
				t.Errorf("executions %+v, want one, finished", es)
			}
		})
	}
}
