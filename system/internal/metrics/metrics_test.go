package metrics_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/internal/testkit/specpeer"
	"github.com/jobbus/jobbus/system/internal/metrics"
	"github.com/jobbus/jobbus/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher()) }

const waitFor = 10 * time.Second

// scrape GETs url (a /metrics endpoint) and returns every sample as
// `name{label="value",...}` -> value, as Prometheus would read it.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	out := make(map[string]float64)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape: bad sample %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// system is a jobbus system whose coordinator reports to a metrics registry served
// over HTTP.
type system struct {
	*jobbustest.System
	reg *metrics.Registry
	url string
	cl  *client.Client
}

func start(t *testing.T, mods ...func(*coordinator.Config)) *system {
	t.Helper()
	reg := metrics.New()
	sys := jobbustest.Start(t, jobbustest.WithCoordinatorConfig(append(mods, func(c *coordinator.Config) {
		c.Observer = reg.Coordinator()
	})...))
	reg.Coordinator().OnLead(sys.Coordinator)
	srv := httptest.NewServer(reg.Handler())
	t.Cleanup(srv.Close)
	return &system{System: sys, reg: reg, url: srv.URL + "/metrics", cl: client.New(sys.NC, client.WithTimeout(waitFor))}
}

func (s *system) worker(t *testing.T) *worker.Worker {
	t.Helper()
	w, _ := s.StartNativeWorker(t)
	s.reg.AddBus("worker", w.BusStats)
	testkit.Eventually(t, waitFor, "the worker listed", func() bool { return jobbustest.WorkerListed(s.cl, w.ID()) })
	return w
}

func (s *system) wait(t *testing.T, id string, want protocol.State) {
	t.Helper()
	testkit.Eventually(t, waitFor, "job "+id+" "+string(want), func() bool {
		j, err := s.cl.Status(context.Background(), id)
		return err == nil && j.State == want
	})
}

// The counters a job moves; each case checks how much every one of them moved.
var lifecycle = []string{
	`jobbus_submissions_total{outcome="accepted"}`,
	`jobbus_submissions_total{outcome="rejected"}`,
	`jobbus_submissions_total{outcome="invalid"}`,
	`jobbus_submissions_total{outcome="duplicate"}`,
	`jobbus_submissions_total{outcome="failed"}`,
	`jobbus_jobs_assigned_total{task_type="%T"}`,
	`jobbus_jobs_completed_total{task_type="%T"}`,
	`jobbus_jobs_failed_total{task_type="%T"}`,
	`jobbus_jobs_retried_total{task_type="%T"}`,
	`jobbus_jobs_cancelled_total{task_type="%T"}`,
	`jobbus_deadline_expiries_total{task_type="%T"}`,
	`jobbus_job_start_latency_seconds_count{task_type="%T"}`,
	`jobbus_job_completion_latency_seconds_count{task_type="%T"}`,
	`jobbus_kv_writes_per_job_count`,
}

func TestLifecycleMovesExactlyItsCounters(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		taskType string
		mods     []func(*coordinator.Config)
		noWorker bool
		run      func(t *testing.T, s *system)
		moved    map[string]float64 // by metric of lifecycle; the others must not move
		jobs     map[protocol.State]float64
	}{
		{
			name: "CompletedJob", taskType: "SHA256",
			run: func(t *testing.T, s *system) {
				id, err := s.cl.Submit(context.Background(), "SHA256", map[string]string{"text": "hello"})
				if err != nil {
					t.Fatal(err)
				}
				s.wait(t, id, protocol.StateCompleted)
			},
			moved: map[string]float64{"accepted": 1, "jobs_assigned": 1, "jobs_completed": 1, "job_start_latency": 1,
				"job_completion_latency": 1, "kv_writes_per_job": 1},
			jobs: map[protocol.State]float64{protocol.StateCompleted: 1},
		},
		{
			name: "FailedAfterRetries", taskType: "FAIL",
			run: func(t *testing.T, s *system) {
				id, err := s.cl.Submit(context.Background(), "FAIL", map[string]int{"failUntilAttempt": 5}, client.MaxAttempts(2))
				if err != nil {
					t.Fatal(err)
				}
				s.wait(t, id, protocol.StateFailed)
			},
			moved: map[string]float64{"accepted": 1, "jobs_assigned": 2, "jobs_retried": 1, "jobs_failed": 1,
				"job_start_latency": 1, "kv_writes_per_job": 1},
			jobs: map[protocol.State]float64{protocol.StateFailed: 1},
		},
		{
			name: "CancelledWhileRunning", taskType: "SLEEP",
			run: func(t *testing.T, s *system) {
				id, err := s.cl.Submit(context.Background(), "SLEEP", map[string]int{"durationMillis": 60000})
				if err != nil {
					t.Fatal(err)
				}
				s.wait(t, id, protocol.StateRunning)
				if ok, _, err := s.cl.Cancel(context.Background(), id); err != nil || !ok {
					t.Fatalf("cancel: %v %v", ok, err)
				}
			},
			moved: map[string]float64{"accepted": 1, "jobs_assigned": 1, "jobs_cancelled": 1, "job_start_latency": 1,
				"kv_writes_per_job": 1},
			jobs: map[protocol.State]float64{protocol.StateCancelled: 1},
		},
		{
			name: "DeadlineExpired", taskType: "SLEEP",
			mods: []func(*coordinator.Config){func(c *coordinator.Config) { c.TaskTimeout = 50 * time.Millisecond }},
			run: func(t *testing.T, s *system) {
				id, err := s.cl.Submit(context.Background(), "SLEEP", map[string]int{"durationMillis": 60000}, client.MaxAttempts(1))
				if err != nil {
					t.Fatal(err)
				}
				s.wait(t, id, protocol.StateFailed)
			},
			moved: map[string]float64{"accepted": 1, "jobs_assigned": 1, "deadline_expiries": 1, "jobs_failed": 1,
				"job_start_latency": 1, "kv_writes_per_job": 1},
			jobs: map[protocol.State]float64{protocol.StateFailed: 1},
		},
		{
			name: "InvalidAndDuplicate", taskType: "SHA256",
			run: func(t *testing.T, s *system) {
				ctx := context.Background()
				if _, err := s.cl.Submit(ctx, "SHA256", map[string]int{"text": 1}); err == nil {
					t.Fatal("an invalid payload was accepted")
				}
				for range 2 {
					if _, err := s.cl.Submit(ctx, "SHA256", map[string]string{"text": "x"}, client.IdempotencyKey("k")); err != nil {
						t.Fatal(err)
					}
				}
			},
			noWorker: true,
			moved:    map[string]float64{"accepted": 1, "invalid": 1, "duplicate": 1},
			jobs:     map[protocol.State]float64{protocol.StateQueued: 1},
		},
		{
			name: "RejectedAtCapacity", taskType: "SHA256",
			mods: []func(*coordinator.Config){func(c *coordinator.Config) { c.MaxActiveJobs = 1 }},
			run: func(t *testing.T, s *system) {
				ctx := context.Background()
				if _, err := s.cl.Submit(ctx, "SHA256", map[string]string{"text": "x"}); err != nil {
					t.Fatal(err)
				}
				if _, err := s.cl.Submit(ctx, "SHA256", map[string]string{"text": "y"}); err == nil {
					t.Fatal("a submission beyond capacity was accepted")
				}
			},
			noWorker: true,
			moved:    map[string]float64{"accepted": 1, "rejected": 1},
			jobs:     map[protocol.State]float64{protocol.StateQueued: 1},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := start(t, tt.mods...)
			if !tt.noWorker {
				s.worker(t)
			}
			names := make([]string, len(lifecycle))
			for i, n := range lifecycle {
				names[i] = strings.ReplaceAll(n, "%T", tt.taskType)
			}
			before := scrape(t, s.url)
			tt.run(t, s)
			// A job's last write lands after the reply that reports it: wait for it.
			var after map[string]float64
			testkit.Eventually(t, waitFor, "the final write counted", func() bool {
				after = scrape(t, s.url)
				return after["jobbus_kv_writes_per_job_count"]-before["jobbus_kv_writes_per_job_count"] == tt.moved["kv_writes_per_job"]
			})
			for _, n := range names {
				want := 0.0
				for k, v := range tt.moved {
					if strings.Contains(n, `"`+k+`"`) || strings.HasPrefix(n, "jobbus_"+k+"_") {
						want = v
					}
				}
				if got := after[n] - before[n]; got != want {
					t.Errorf("%s moved by %v, want %v", n, got, want)
				}
			}
			for _, st := range protocol.States {
				n := `jobbus_jobs{state="` + string(st) + `"}`
				if after[n] != tt.jobs[st] {
					t.Errorf("%s = %v, want %v", n, after[n], tt.jobs[st])
				}
			}
			if after["jobbus_coordinator_leading"] != 1 {
				t.Errorf("jobbus_coordinator_leading = %v, want 1", after["jobbus_coordinator_leading"])
			}
			if after["jobbus_kv_write_duration_seconds_count"] < 1 {
				t.Error("no KV write was timed")
			}
		})
	}
}

func TestWorkersAndBusCounters(t *testing.T) {
	t.Parallel()
	s := start(t)
	w := s.worker(t)
	id, err := s.cl.Submit(context.Background(), "SLEEP", map[string]int{"durationMillis": 60000})
	if err != nil {
		t.Fatal(err)
	}
	s.wait(t, id, protocol.StateRunning)
	// The status says RUNNING once the coordinator has decided; the assignment reaches
	// the worker after that, so the worker's count of it is certain only once it runs.
	testkit.Eventually(t, waitFor, "the worker running its assignment", func() bool { return w.Running() == 1 })
	m := scrape(t, s.url)
	for name, want := range map[string]float64{
		"jobbus_workers":               1,
		"jobbus_worker_capacity_slots": float64(worker.DefaultCapacity),
		"jobbus_worker_busy_slots":     1,
		// The job's queue: the default one.
		`jobbus_queue_running{queue="default"}`:       1,
		`jobbus_queue_depth{queue="default"}`:         0,
		`jobbus_queue_paused{queue="default"}`:        0,
		`jobbus_queue_started_total{queue="default"}`: 1,
	} {
		if m[name] != want {
			t.Errorf("%s = %v, want %v", name, m[name], want)
		}
	}
	// The worker asked to register and reported nothing yet; the coordinator received
	// those asks and told the worker its assignment.
	for _, name := range []string{
		`jobbus_bus_asks_total{outcome="ok",role="worker"}`,
		`jobbus_bus_ask_duration_seconds_count{role="worker"}`,
		`jobbus_bus_messages_received_total{kind="ask",role="coordinator"}`,
		`jobbus_bus_messages_sent_total{kind="tell",role="coordinator"}`,
		`jobbus_bus_messages_received_total{kind="tell",role="worker"}`,
	} {
		if m[name] < 1 {
			t.Errorf("%s = %v, want at least 1", name, m[name])
		}
	}
	if got, want := m[`jobbus_bus_asks_total{outcome="ok",role="worker"}`], m[`jobbus_bus_ask_duration_seconds_count{role="worker"}`]; got != want {
		t.Errorf("worker asks ok %v, but %v timed", got, want)
	}
	if _, ok := m[`jobbus_bus_ask_duration_seconds_bucket{role="worker",le="+Inf"}`]; !ok {
		t.Error("no ask latency histogram for the worker")
	}
	if got := m[`jobbus_bus_handlers_in_flight{role="worker"}`]; got < 0 {
		t.Errorf("worker %s handlers in flight %v", w.ID(), got)
	}
}

func TestLeaderChangeKeepsBusCountersGrowing(t *testing.T) {
	t.Parallel()
	s := start(t)
	s.worker(t)
	before := scrape(t, s.url)
	asks := `jobbus_bus_messages_received_total{kind="ask",role="coordinator"}`
	if before[asks] < 1 {
		t.Fatalf("%s = %v before the change", asks, before[asks])
	}
	s.RestartCoordinator(t)
	s.reg.Coordinator().OnLead(s.Coordinator)
	after := scrape(t, s.url)
	if after[asks] < before[asks] {
		t.Errorf("%s went from %v down to %v across a leader change", asks, before[asks], after[asks])
	}
	if d := after["jobbus_leader_changes_total"] - before["jobbus_leader_changes_total"]; d != 1 {
		t.Errorf("jobbus_leader_changes_total moved by %v, want 1", d)
	}
}

func TestBridgeConnectionsAndFrameErrors(t *testing.T) {
	t.Parallel()
	s := start(t)
	b := s.StartBridge(t)
	s.reg.AddBridge(b)

	open := func(addr net.Addr) net.Conn {
		c, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	// An open connection is counted while open.
	idle := open(b.ClientAddr())
	testkit.Eventually(t, waitFor, "the client connection counted", func() bool {
		return scrape(t, s.url)[`jobbus_bridge_connections{port="client"}`] == 1
	})
	_ = idle
	// A length prefix beyond the limit, then a frame that is not a message.
	bad := open(b.ClientAddr())
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], 1<<30)
	_, _ = bad.Write(hdr[:])
	_, _ = io.Copy(io.Discard, bad) // the bridge answers ERROR and closes
	_ = bad.Close()
	junk := open(b.WorkerAddr())
	binary.BigEndian.PutUint32(hdr[:], 3)
	_, _ = junk.Write(append(hdr[:], "{x}"...))
	_, _ = io.Copy(io.Discard, junk)
	_ = junk.Close()

	testkit.Eventually(t, waitFor, "the frame errors counted and the bad connections gone", func() bool {
		m := scrape(t, s.url)
		return m[`jobbus_bridge_frame_errors_total{port="client",reason="bad_length"}`] == 1 &&
			m[`jobbus_bridge_frame_errors_total{port="worker",reason="malformed"}`] == 1 &&
			m[`jobbus_bridge_connections{port="client"}`] == 1 && m[`jobbus_bridge_connections{port="worker"}`] == 0
	})
	m := scrape(t, s.url)
	for name, want := range map[string]float64{
		`jobbus_bridge_connections_accepted_total{port="client"}`:             2,
		`jobbus_bridge_connections_accepted_total{port="worker"}`:             1,
		`jobbus_bridge_connections{port="client"}`:                            1,
		`jobbus_bridge_connections{port="worker"}`:                            0,
		`jobbus_bridge_frame_errors_total{port="client",reason="malformed"}`:  0,
		`jobbus_bridge_frame_errors_total{port="worker",reason="bad_length"}`: 0,
		`jobbus_bridge_frame_errors_total{port="client",reason="stalled"}`:    0,
		`jobbus_bridge_connections_refused_total{port="client"}`:              0,
		`jobbus_bus_messages_sent_total{kind="heartbeat",role="bridge"}`:      0,
	} {
		if m[name] != want {
			t.Errorf("%s = %v, want %v", name, m[name], want)
		}
	}
}

// TestBusStatsAddUp checks the sum that metrics rely on to report several nodes (and
// closed ones) as one.
func TestBusStatsAddUp(t *testing.T) {
	t.Parallel()
	a := bus.Stats{Sent: bus.KindCounts{Tell: 1}, Asks: bus.AskCounts{OK: 2},
		AskLatency: []bus.LatencyBucket{{UpTo: time.Millisecond, Count: 2}, {Count: 1}}, AskLatencySum: 3 * time.Millisecond}
	var sum bus.Stats
	sum.Add(a)
	sum.Add(a)
	if sum.Sent.Tell != 2 || sum.Asks.OK != 4 || sum.AskLatency[0].Count != 4 || sum.AskLatency[1].Count != 2 ||
		sum.AskLatency[0].UpTo != time.Millisecond || sum.AskLatencySum != 6*time.Millisecond {
		t.Errorf("sum %+v", sum)
	}
	if a.AskLatency[0].Count != 2 {
		t.Error("Add changed its argument")
	}
}

// TestStoreSyncs: the coordinator's fsyncs of the job store (serve --sync always on a
// lone server) are counted: how long they took, how many job writes each made
// durable, and the ones that failed.
func TestStoreSyncs(t *testing.T) {
	t.Parallel()
	var (
		y    atomic.Pointer[embeddednats.StreamSync]
		fail atomic.Bool
	)
	s := start(t, func(c *coordinator.Config) {
		c.SyncJobs = func() error { // the server exists once start returns; jobs come later
			if fail.Load() {
				return errors.New("disk on fire")
			}
			return y.Load().Sync()
		}
	})
	y.Store(s.Server.StreamSync(s.NC, "KV_"+protocol.JobsBucket))
	s.worker(t)
	const jobs = 5
	for i := range jobs {
		id, err := s.cl.Submit(context.Background(), "SHA256", map[string]string{"text": strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		s.wait(t, id, protocol.StateCompleted)
	}
	// A job reads COMPLETED as soon as the coordinator decides it; the write that
	// records it may still be in its group's fsync, so the counts are awaited.
	var syncs, writes float64
	testkit.Eventually(t, waitFor, "every job's writes counted as synced", func() bool {
		m := scrape(t, s.url)
		syncs, writes = m["jobbus_store_sync_duration_seconds_count"], m["jobbus_store_sync_writes_sum"]
		return writes >= 2*jobs
	})
	if syncs < 1 || syncs > writes {
		t.Fatalf("%v syncs made %v writes durable; want at least one, and no more syncs than writes", syncs, writes)
	}

	fail.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, _ = s.cl.Submit(ctx, "SHA256", map[string]string{"text": "unsynced"})
	testkit.Eventually(t, waitFor, "a failed sync counted", func() bool {
		return scrape(t, s.url)["jobbus_store_sync_errors_total"] >= 1
	})
	fail.Store(false) // the waiting write is synced, so the coordinator stops cleanly
}

// TestBridgeCountsTCPWorkersResults: a spec TCP worker's result, delivered by the
// bridge (in a batch with others when the coordinator takes them), is counted as
// answered once the coordinator answers it.
func TestBridgeCountsTCPWorkersResults(t *testing.T) {
	t.Parallel()
	s := start(t)
	b := s.StartBridge(t)
	s.reg.AddBridge(b)

	w := specpeer.Dial(t, b.WorkerAddr().String())
	w.Register("tcp-w", 1)
	c := specpeer.Dial(t, b.ClientAddr().String())
	id := c.Submit("SHA256", `{"text":"x"}`)
	a := w.ExpectAssign(id)
	result := "r"
	w.MustSend(&protocol.TaskResult{WorkerID: "tcp-w", JobID: id, AttemptID: a.AttemptID, Success: true, Result: &result})
	testkit.Eventually(t, waitFor, "the TCP worker's result counted as answered", func() bool {
		return scrape(t, s.url)[`jobbus_bridge_results_total{outcome="answered"}`] == 1
	})
	m := scrape(t, s.url)
	for _, outcome := range []string{"refused", "abandoned"} {
		if n := m[`jobbus_bridge_results_total{outcome="`+outcome+`"}`]; n != 0 {
			t.Errorf("%s results %v, want 0", outcome, n)
		}
	}
}
