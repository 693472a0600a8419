package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/system"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tcpworker"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure end-to-end throughput and latency: submit trivial jobs, wait until all are done",
		Description: `Without --nats or --connect it builds a whole system in-process in a temporary
store (embedded NATS, coordinator, bridge for --transport tcp, and --workers workers of
--worker-capacity), submits --jobs SHA256 jobs from --submitters concurrent clients over
--transport, and reports jobs/s from the first submission to the last completion, the
steady rate counted from the first start, the percentiles of submit -> start and
submit -> completed under that load, and the CPU time per job. --idle N then runs N
jobs one at a time (after 10 unmeasured) for the latency of an idle system. With the
global --nats or --connect it drives that running system instead (its workers must be
running; start times and CPU are then not seen) and waits until it is idle.

--json prints one object {"system","settings","metrics"}, the shape of the River and
Asynq benchmark files, so that their summarize tool reads jobbus's runs too.

More: docs/performance.md (what it measures, --sync, how to read the figures).

Example:
   jobbus bench --jobs 20000 --workers 4 --worker-capacity 64
   jobbus bench --jobs 20000 --submitters 16 --workers 1 --worker-capacity 64 --idle 200
   jobbus bench --transport tcp --sync always
   jobbus bench --custom          # the cost of a custom task type against the built-in`,
		Flags: append([]cli.Flag{
			&cli.IntFlag{Name: "jobs", Value: 20000, Usage: "jobs to run under load (0: only the --idle run)", EnvVars: env("bench-jobs")},
			&cli.IntFlag{Name: "workers", Value: 4, Usage: "in-process workers", EnvVars: env("bench-workers")},
			&cli.IntFlag{Name: "worker-capacity", Value: 64, Usage: "capacity of each worker", EnvVars: env("bench-worker-capacity")},
			&cli.IntFlag{Name: "submitters", Value: 64, Usage: "concurrent submitters (sharing one NATS connection, or one TCP connection to the client port)", EnvVars: env("bench-submitters")},
			&cli.IntFlag{Name: "submit-many", Usage: "each submitter sends this many jobs at a time with SubmitMany (one request) instead of one Submit each (0: Submit)", EnvVars: env("bench-submit-many")},
			&cli.StringFlag{Name: "transport", Value: "native", Usage: "native (NATS) or tcp (the bridge's ports) for clients and workers", EnvVars: env("bench-transport")},
			&cli.StringFlag{Name: "sync", Value: "default", Usage: "in-process system: " + syncFlagUsage, EnvVars: env("bench-sync")},
			&cli.StringFlag{Name: "data-dir", Usage: "in-process system: run on this store, kept afterwards, instead of a temporary one (with a store filled by go run ./internal/cmd/fillstore: throughput with that many jobs retained)", EnvVars: env("bench-data-dir")},
			&cli.IntFlag{Name: "warmup", Usage: "unmeasured jobs run first, as the peers' benchmarks do (640)", EnvVars: env("bench-warmup")},
			&cli.IntFlag{Name: "idle", Usage: "afterwards, run this many jobs one at a time for the idle latency", EnvVars: env("bench-idle")},
			&cli.BoolFlag{Name: "json", Usage: "print the results as one JSON object", EnvVars: env("bench-json")},
			&cli.BoolFlag{Name: "metrics", Usage: "in-process system: collect Prometheus metrics and scrape them every second, as serve does", EnvVars: env("bench-metrics")},
			&cli.BoolFlag{Name: "custom", Usage: "submit " + benchCustomType + " jobs (SHA256's work as a task type the workers declare, with a JSON Schema) instead of SHA256; native transport only", EnvVars: env("bench-custom")},
			benchQueuesFlag(), benchKeysFlag(), // bench_queues.go
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile of the run to this file (go tool pprof)", EnvVars: env("bench-cpuprofile")},
			&cli.StringFlag{Name: "memprofile", Usage: "write a profile of the run's heap allocations to this file (go tool pprof -sample_index alloc_space)", EnvVars: env("bench-memprofile")},
			&cli.StringFlag{Name: "limit", Usage: "set a rate limit on the task type bench submits before the run, as jobbus limit set --rate (1000000/s: configured but not binding)", EnvVars: env("bench-limit")},
			&cli.Int64Flag{Name: "limit-burst", Value: 1, Usage: "with --limit, the limit's burst", EnvVars: env("bench-limit-burst")},
		}, append(scheduledBenchFlags(), progressFloodFlags()...)...), // bench_scheduled.go, bench_flood.go
		Action: bench,
	}
}

// benchSystem is what a bench run drives: clients, and how to tell when it is idle.
type benchSystem struct {
	clients []*client.Client
	close   func()
	// queues and keys spread the jobs over named queues and concurrency keys
	// (bench_queues.go); none by default.
	queues []string
	keys   int
	// nc, when set, reaches the system's NATS: the idle run watches completions on it.
	nc *nats.Conn
	// probe sees the in-process workers start jobs; nil for a system bench did not build.
	probe *startProbe
	// taskType is what bench submits: SHA256, or benchCustomType with --custom.
	taskType string
	// kept is how many jobs the store held when the in-process system started.
	kept int
	// flood is --progress-flood's, for an in-process native system; else nil.
	flood *progressFlood
	// many is --submit-many: jobs a submitter sends in one SubmitMany; 0: Submit each.
	many int
	// messages counts the messages the in-process NATS server carried so far (in and
	// out, JetStream's writes and acknowledgements among them); nil for a system bench
	// did not build.
	messages func() int64
}

// idleWarmup is the number of unmeasured jobs before the idle run, as the peers' have.
const idleWarmup = 10

func bench(c *cli.Context) error {
	transport := c.String("transport")
	if transport != "native" && transport != "tcp" {
		return usageError("--transport must be native or tcp, got %q", transport)
	}
	n, submitters, warmup, idle := c.Int("jobs"), c.Int("submitters"), c.Int("warmup"), c.Int("idle")
	if n < 0 || submitters < 1 || warmup < 0 || idle < 0 {
		return usageError("--jobs, --warmup and --idle must be at least 0, --submitters at least 1")
	}
	if many := c.Int("submit-many"); many < 0 || many > protocol.MaxSubmissions {
		return usageError("--submit-many must be between 0 and %d, got %d", protocol.MaxSubmissions, many)
	}
	if err := checkLocalWorkers(c, 1); err != nil {
		return err
	}
	if err := checkBenchLimit(c); err != nil {
		return err
	}
	syncOpts, err := syncOptions(c.String("sync"), true) // the bench's server is lone
	if err != nil {
		return err
	}
	external := global(c, "connect") != "" || global(c, "nats") != "" || global(c, "context") != ""
	if external && c.String("sync") != "default" {
		return usageError("--sync applies to the system bench builds; give it to the serve that runs yours")
	}
	taskType := benchTask
	if c.Bool("custom") {
		if transport != "native" {
			return usageError("--custom needs --transport native: the in-process TCP workers run the built-ins only")
		}
		taskType = benchCustomType
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	scheduled := c.Int("scheduled")
	if scheduled < 0 || scheduled > 0 && external {
		return usageError("--scheduled must be at least 0, and needs the in-process system (its workers see when each job starts)")
	}
	if n == 0 && idle == 0 && scheduled == 0 {
		return usageError("nothing to measure: give --jobs, --idle or --scheduled")
	}

	probeJobs := 0
	if !external {
		probeJobs = warmup + n + idleWarmup + idle + scheduled
	}
	sys, err := benchTarget(ctx, c, transport, syncOpts, probeJobs)
	if err != nil {
		return exitErr(err)
	}
	defer sys.close()
	sys.taskType, sys.many = taskType, c.Int("submit-many")
	if err := sys.useQueues(ctx, c); err != nil { // bench_queues.go
		return exitErr(err)
	}
	if err := setBenchLimit(ctx, c, sys); err != nil {
		return exitErr(err)
	}
	out := c.App.Writer
	asJSON := c.Bool("json")
	if !asJSON {
		fmt.Fprintf(out, "bench: %d %s jobs, %d submitters, transport %s, sync %s\n", n, taskType, submitters, transport, c.String("sync"))
		if dir := c.String("data-dir"); dir != "" {
			fmt.Fprintf(out, "bench: store %s held %d jobs at start\n", dir, sys.kept)
		}
	}
	next := 0 // the number of the next job, for the probe
	if warmup > 0 {
		if _, err := runBench(ctx, sys, warmup, next, func(int) {}, func() {}); err != nil {
			return exitErr(fmt.Errorf("warm-up: %w", err))
		}
		next += warmup
	}
	stopProfile, err := startProfile(c.String("cpuprofile"), c.String("memprofile"))
	if err != nil {
		return exitErr(err)
	}
	var waitScheduled func() (scheduledResult, error)
	if scheduled > 0 { // numbered after every other job
		waitScheduled, err = scheduledBench(ctx, sys, scheduled, probeJobs-scheduled, c.Duration("scheduled-lead"), c.Duration("scheduled-spread"))
		if err != nil {
			return exitErr(err)
		}
	}
	loadStart := time.Now()
	if sys.flood != nil {
		if err := sys.flood.start(ctx, sys); err != nil {
			return exitErr(err)
		}
	}
	var run *benchResult
	if n > 0 {
		progress := func(int) {}
		if !asJSON {
			progress = progressTo(c.App.ErrWriter, n)
		}
		res, err := runBench(ctx, sys, n, next, progress, stopProfile)
		if err != nil {
			stopProfile()
			return exitErr(err)
		}
		run = &res
		next += n
	}
	stopProfile()
	if sys.flood != nil {
		sys.flood.finish()
	}
	var sched *scheduledResult
	if waitScheduled != nil {
		res, err := waitScheduled()
		if err != nil {
			return exitErr(err)
		}
		sched = &res
	}
	var idleRes *idleResult
	if idle > 0 {
		res, err := runIdle(ctx, sys, idle, next)
		if err != nil {
			return exitErr(err)
		}
		idleRes = &res
	}
	rep := newBenchReport(map[string]string{
		"transport": transport, "sync": c.String("sync"), "jobs": strconv.Itoa(n),
		"submitters": strconv.Itoa(submitters), "workers": strconv.Itoa(c.Int("workers")),
		"worker_capacity": strconv.Itoa(c.Int("worker-capacity")), "warmup": strconv.Itoa(warmup),
		"idle": strconv.Itoa(idle), "in_process": strconv.FormatBool(!external), "task_type": taskType,
		"kept_at_start": strconv.Itoa(sys.kept),
	}, run, idleRes)
	if sched != nil {
		rep.Settings["scheduled"] = strconv.Itoa(scheduled)
		sched.put(rep.Metrics)
	}
	if sys.flood != nil {
		rep.Settings["progress_flood"] = strconv.Itoa(sys.flood.jobs)
		sys.flood.put(rep.Metrics)
	}
	if asJSON {
		return rep.writeJSON(out)
	}
	rep.writeText(out, !external)
	if sys.flood != nil {
		sys.flood.report(out)
	}
	if sched != nil {
		var loadEnd time.Time
		if run != nil {
			loadEnd = loadStart.Add(run.lastDone)
		}
		sched.writeText(out, loadEnd)
	}
	return nil
}

// benchTarget connects to the system named by --nats or --connect, or builds one.
func benchTarget(ctx context.Context, c *cli.Context, transport string, syncOpts []embeddednats.Option, probeJobs int) (*benchSystem, error) {
	submitters := c.Int("submitters")
	if addr := global(c, "connect"); addr != "" {
		return dialClients(ctx, submitters, sharedTCP(ctx, addr))
	}
	if global(c, "nats") != "" || global(c, "context") != "" {
		target, err := natsTarget(c, false)
		if err != nil {
			return nil, err
		}
		nc, err := nats.Connect(target.url, append([]nats.Option{nats.Timeout(natsDialTimeout)}, target.opts...)...)
		if err != nil {
			return nil, fmt.Errorf("cannot reach NATS at %s: %w", target.where(), err)
		}
		sys, err := dialClients(ctx, submitters, func() (*client.Client, error) { return client.New(nc), nil })
		if err != nil {
			nc.Close()
			return nil, err
		}
		closeClients := sys.close
		sys.close = func() { closeClients(); nc.Close() }
		sys.nc = nc
		return sys, nil
	}
	return inProcessSystem(ctx, c, transport, syncOpts, newStartProbe(probeJobs), newProgressFlood(c))
}

// sharedTCP dials the client port once and gives every submitter that client, whose
// one connection carries their requests together, as the native submitters share one
// NATS connection.
func sharedTCP(ctx context.Context, addr string) func() (*client.Client, error) {
	var shared *client.Client
	return func() (*client.Client, error) {
		if shared != nil {
			return shared, nil
		}
		cl, err := client.DialTCP(ctx, addr)
		shared = cl
		return cl, err
	}
}

func dialClients(ctx context.Context, n int, dial func() (*client.Client, error)) (*benchSystem, error) {
	sys := &benchSystem{}
	sys.close = func() {
		for _, cl := range sys.clients {
			_ = cl.Close()
		}
	}
	for range n {
		cl, err := dial()
		if err != nil {
			sys.close()
			return nil, err
		}
		sys.clients = append(sys.clients, cl)
	}
	return sys, nil
}

// inProcessSystem builds the system serve runs (system.Start: embedded NATS, the
// coordinator with its election, the bridge for tcp) in --data-dir, or without one in
// a temporary store that is removed afterwards, and the workers and clients that load
// it. The workers report their starts to probe; --sync always makes the coordinator
// fsync every job write, a group at a time, before anything depends on it.
func inProcessSystem(ctx context.Context, c *cli.Context, transport string, syncOpts []embeddednats.Option, probe *startProbe, flood *progressFlood) (*benchSystem, error) {
	workers, capacity := c.Int("workers"), c.Int("worker-capacity")
	qs, err := benchQueues(c)
	if err != nil {
		return nil, err
	}
	cfg := coordinator.DefaultConfig()
	cfg.MaxActiveJobs = 1 << 30
	cfg.MaxScheduledJobs = 1 << 30
	// OTEL_* as for serve: tracing the coordinator, the workers and the clients.
	tp, flushTraces, err := tracerFromEnv(c, "bench", nil)
	if err != nil {
		return nil, err
	}
	cfg.TracerProvider = tp
	scfg := system.Config{
		NATS: system.NATS{
			Server: append([]embeddednats.Option{
				embeddednats.WithListen("127.0.0.1:-1"),
				embeddednats.WithStoreGuard(embeddednats.DefaultStoreCheck, embeddednats.DefaultStoreProbe),
			}, syncOpts...),
			StoreDir: c.String("data-dir"),
			SyncJobs: c.String("sync") == "always",
		},
		Coordinator: &cfg,
		Metrics:     c.Bool("metrics"),
	}
	if transport == "tcp" {
		bcfg := bridge.DefaultConfig()
		bcfg.WorkerListen, bcfg.ClientListen = "127.0.0.1:0", "127.0.0.1:0"
		scfg.Bridge = &bcfg
	} else {
		// Native workers reach NATS over loopback TCP as they would from another
		// process, so that both transports pay for their sockets.
		scfg.Workers = system.Workers{Count: workers, Dial: true,
			Options: func() []worker.Option {
				return []worker.Option{worker.WithCapacity(capacity), worker.WithLogger(nil), worker.WithTasks(probe.tasks()), worker.WithTracerProvider(tp), worker.WithQueues(qs...)}
			},
			Setup: func(w *worker.Worker) error {
				return errors.Join(worker.HandleJSON(w, benchCustomType, probe.custom), flood.handle(w)) // bench_flood.go
			},
		}
	}
	sys, err := system.Start(ctx, scfg)
	if err != nil {
		flushTraces()
		return nil, err
	}
	cleanups := []func(){flushTraces, func() { drainThenClose(ctx, sys) }}
	cleanup := func() {
		for _, f := range slices.Backward(cleanups) {
			f()
		}
	}
	fail := func(err error) (*benchSystem, error) { cleanup(); return nil, err }
	leader, err := sys.Leading(ctx)
	if err != nil {
		return fail(err)
	}
	if h := sys.MetricsHandler(); h != nil {
		cleanups = append(cleanups, scrapeEverySecond(h))
	}
	if br := sys.Bridge(); br != nil {
		wctx, stopWorkers := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		cleanups = append(cleanups, func() { stopWorkers(); wg.Wait() })
		for range workers {
			w, err := tcpworker.New(br.WorkerAddr().String(), tcpworker.WithCapacity(capacity), tcpworker.WithLogger(nil), tcpworker.WithTasks(probe.tasks()), tcpworker.WithQueues(qs...))
			if err != nil {
				return fail(err)
			}
			wg.Go(func() { _ = w.Run(wctx) })
		}
	}
	cnc, err := nats.Connect(sys.ClientURL())
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, cnc.Close)
	dial := func() (*client.Client, error) { return client.New(cnc, client.WithTracerProvider(tp)), nil }
	if br := sys.Bridge(); br != nil {
		dial = sharedTCP(ctx, br.ClientAddr().String())
	}
	bs, err := dialClients(ctx, c.Int("submitters"), dial)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, bs.close)
	bs.close = cleanup
	bs.nc, bs.probe = cnc, probe
	if srv := sys.Server(); srv != nil {
		bs.messages = serverMessages(srv.NATS())
	}
	if transport == "native" {
		bs.flood = flood
	}
	for _, n := range leader.Stats().Jobs {
		bs.kept += n
	}
	return bs, nil
}

// drainThenClose closes sys once its local workers have drained, as serve does: a job
// still running as the bench ends (a --progress-flood job, stopped with the measured
// run) reports to a coordinator that is still there. Closed at once, the coordinator
// stopped with the worker, which retried the result for its whole shutdown timeout.
func drainThenClose(ctx context.Context, sys *system.System) {
	dctx, cancel := context.WithTimeout(ctx, worker.DefaultShutdownTimeout)
	defer cancel()
	_ = sys.Drain(dctx) // on an interrupt or past the timeout, Close stops what still runs
	_ = sys.Close()
}

// submit submits len(ids) jobs numbered from k, with Submit, or with one SubmitMany
// under --submit-many, and writes their ids into ids.
func (sys *benchSystem) submit(ctx context.Context, cl *client.Client, k int, ids []string) error {
	if sys.many == 0 {
		id, err := cl.Submit(ctx, sys.taskType, benchPayload(k), sys.submitOptions(k)...)
		ids[0] = id
		return err
	}
	subs := make([]client.Submission, len(ids))
	for i := range subs {
		subs[i] = client.Submission{TaskType: sys.taskType, Payload: benchPayload(k + i), Options: sys.submitOptions(k + i)}
	}
	res, err := cl.SubmitMany(ctx, subs)
	if err != nil {
		return err
	}
	for i, r := range res {
		if r.Err != nil {
			return r.Err
		}
		ids[i] = r.JobID
	}
	return nil
}

// runBench submits n jobs, numbered from first, over the clients, one submitter each,
// waits until no job is active, calls measured (the CPU profile stops there), and then
// reads when each job completed.
func runBench(ctx context.Context, sys *benchSystem, n, first int, progress func(done int), measured func()) (benchResult, error) {
	clients := sys.clients
	var next, done atomic.Int64
	submitAt := make([]time.Time, n)
	ids := make([]string, n)
	ack := make([]time.Duration, n)
	errs := make(chan error, len(clients))
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	cpu0, _, cpuOK := processUsage()
	msgs0 := sys.countMessages()
	start := time.Now()
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			step := max(sys.many, 1)
			for {
				k := int(next.Add(int64(step))) - step
				if k >= n {
					return
				}
				end := min(k+step, n)
				t0 := time.Now()
				if err := sys.submit(ctx, cl, first+k, ids[k:end]); err != nil {
					errs <- err
					return
				}
				for j := k; j < end; j++ {
					submitAt[j], ack[j] = t0, time.Since(t0)
				}
				progress(int(done.Add(int64(end - k))))
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return benchResult{}, fmt.Errorf("submit: %w", err)
	}
	res := benchResult{jobs: n, submitted: time.Since(start), submit: newDist(ack)}
	if err := waitIdle(ctx, clients[0], sys.flood.running()); err != nil {
		return res, err
	}
	cpu1, peak, _ := processUsage()
	res.cpu, res.cpuOK, res.cpuWall, res.peakRSS = cpu1-cpu0, cpuOK, time.Since(start), peak
	if sys.messages != nil {
		res.messages = sys.countMessages() - msgs0
	}
	measured()
	runtime.ReadMemStats(&mem1)
	res.allocs, res.allocBytes = mem1.Mallocs-mem0.Mallocs, mem1.TotalAlloc-mem0.TotalAlloc
	doneAt, err := completedAt(ctx, clients[0], ids)
	if err != nil {
		return res, err
	}
	var starts, completes []time.Duration
	var lastDone time.Time
	for k, id := range ids {
		if t := sys.probe.started(first + k); !t.IsZero() {
			starts = append(starts, t.Sub(submitAt[k]))
			if d := t.Sub(start); res.firstStart == 0 || d < res.firstStart {
				res.firstStart = d
			}
		}
		if t, ok := doneAt[id]; ok {
			completes = append(completes, max(t.Sub(submitAt[k]), 0))
			if t.After(lastDone) {
				lastDone = t
			}
		}
	}
	if len(completes) < n {
		return res, fmt.Errorf("only %d of the %d jobs completed", len(completes), n)
	}
	// The last completion as the coordinator stored it, rather than when the polling
	// above noticed, so the rate does not depend on the polling interval.
	res.lastDone = max(lastDone.Sub(start), time.Millisecond)
	res.total = res.lastDone
	res.start, res.complete = newDist(starts), newDist(completes)
	return res, nil
}

// completedAt reads when each of the jobs ids completed, by the coordinator's clock
// (its updatedAtMillis), from the newest COMPLETED jobs until all are found.
func completedAt(ctx context.Context, cl *client.Client, ids []string) (map[string]time.Time, error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	at := make(map[string]time.Time, len(ids))
	state := protocol.StateCompleted
	req := protocol.ListJobs{State: &state, Limit: 1000}
	for len(at) < len(want) {
		page, err := cl.List(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("list the completed jobs: %w", err)
		}
		for _, j := range page.Jobs {
			if want[j.JobID] {
				at[j.JobID] = time.UnixMilli(j.UpdatedAtMillis)
			}
		}
		if page.NextCursor == "" {
			break
		}
		req.Cursor = page.NextCursor
	}
	return at, nil
}

// waitIdle polls until no job is QUEUED, RUNNING or in RETRY_WAIT but those of
// ignore (--progress-flood's, running on).
func waitIdle(ctx context.Context, cl *client.Client, ignore map[string]bool) error {
	for {
		idle := true
		for _, st := range []protocol.State{protocol.StateQueued, protocol.StateRunning, protocol.StateRetryWait} {
			page, err := cl.List(ctx, protocol.ListJobs{State: &st, Limit: 1 + len(ignore)})
			if err != nil {
				return fmt.Errorf("wait for the jobs to finish: %w", err)
			}
			for _, j := range page.Jobs {
				idle = idle && ignore[j.JobID]
			}
		}
		if idle {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("interrupted before the jobs finished")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// progressTo draws a progress bar of submissions on a terminal, and nothing elsewhere.
func progressTo(w io.Writer, total int) func(done int) {
	if !isTerminal(w) {
		return func(int) {}
	}
	var mu sync.Mutex
	return func(done int) {
		if done%max(total/100, 1) != 0 && done != total {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		const width = 30
		filled := done * width / total
		fmt.Fprintf(w, "\r[%s%s] %d/%d submitted", bar(filled, '#'), bar(width-filled, ' '), done, total)
		if done == total {
			fmt.Fprintln(w)
		}
	}
}

func bar(n int, r rune) string {
	b := make([]rune, n)
	for i := range b {
		b[i] = r
	}
	return string(b)
}

// startProfile starts a CPU profile into cpuPath, and counts heap allocations from now
// for memPath, if asked for; stop writes them, and may be called more than once.
func startProfile(cpuPath, memPath string) (stop func(), err error) {
	var stops []func() error
	if memPath != "" {
		f, err := os.Create(memPath)
		if err != nil {
			return nil, fmt.Errorf("memory profile: %w", err)
		}
		// Sampled finer than the default from here on; the profile also holds what was
		// allocated before (start-up, the warm-up), which the run's jobs outweigh.
		runtime.MemProfileRate = 64 << 10
		stops = append(stops, func() error {
			defer f.Close()
			return pprof.Lookup("allocs").WriteTo(f, 0)
		})
	}
	if cpuPath != "" {
		f, err := os.Create(cpuPath)
		if err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		stops = append(stops, func() error { pprof.StopCPUProfile(); return f.Close() })
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			for _, stop := range stops {
				_ = stop()
			}
		})
	}, nil
}

// benchCustomType is SHA256's work as a task type of the workers' own: its payload is
// checked against a JSON Schema derived from benchArgs, decoded by HandleJSON, and its
// jobs routed by type, so --custom measures what a custom type costs beyond a built-in.
const benchCustomType = "BENCH_SHA256"

type benchArgs struct {
	Text string `json:"text" jsonschema:"maxLength=200000"`
}

func benchSHA256(_ context.Context, _ int, a benchArgs) (string, error) {
	sum := sha256.Sum256([]byte(a.Text))
	return hex.EncodeToString(sum[:]), nil
}
