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
	"runtime/pprof"
	"slices"
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
	"github.com/jobbus/jobbus/internal/metrics"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tcpworker"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure end-to-end throughput: submit trivial jobs, wait until all are done",
		Description: `Without --nats or --connect it builds a whole system in-process in a temporary
store (embedded NATS, coordinator, bridge for --transport tcp, and --workers workers of
--worker-capacity), submits --jobs SHA256 jobs from --submitters concurrent clients over
--transport, and reports jobs/s and the submit latency. With the global --nats or --connect it
drives that running system instead (its workers must be running) and waits until it is idle.

Example:
   jobbus bench --jobs 20000 --workers 4 --worker-capacity 64
   jobbus bench --transport tcp
   jobbus bench --custom          # the cost of a custom task type against the built-in`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "jobs", Value: 20000, Usage: "jobs to run", EnvVars: env("bench-jobs")},
			&cli.IntFlag{Name: "workers", Value: 4, Usage: "in-process workers", EnvVars: env("bench-workers")},
			&cli.IntFlag{Name: "worker-capacity", Value: 64, Usage: "capacity of each worker", EnvVars: env("bench-worker-capacity")},
			&cli.IntFlag{Name: "submitters", Value: 64, Usage: "concurrent submitting clients", EnvVars: env("bench-submitters")},
			&cli.StringFlag{Name: "transport", Value: "native", Usage: "native (NATS) or tcp (the bridge's ports) for clients and workers", EnvVars: env("bench-transport")},
			&cli.BoolFlag{Name: "metrics", Usage: "in-process system: collect Prometheus metrics and scrape them every second, as serve does", EnvVars: env("bench-metrics")},
			&cli.BoolFlag{Name: "custom", Usage: "submit " + benchCustomType + " jobs (SHA256's work as a task type the workers declare, with a JSON Schema) instead of SHA256; native transport only", EnvVars: env("bench-custom")},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile of the run to this file (go tool pprof)", EnvVars: env("bench-cpuprofile")},
		},
		Action: bench,
	}
}

// benchSystem is what a bench run drives: clients, and how to tell when it is idle.
type benchSystem struct {
	clients []*client.Client
	close   func()
}

func bench(c *cli.Context) error {
	transport := c.String("transport")
	if transport != "native" && transport != "tcp" {
		return usageError("--transport must be native or tcp, got %q", transport)
	}
	n, submitters := c.Int("jobs"), c.Int("submitters")
	if n < 1 || submitters < 1 {
		return usageError("--jobs and --submitters must be at least 1")
	}
	taskType := "SHA256"
	if c.Bool("custom") {
		if transport != "native" {
			return usageError("--custom needs --transport native: the in-process TCP workers run the built-ins only")
		}
		taskType = benchCustomType
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	sys, err := benchTarget(ctx, c, transport)
	if err != nil {
		return exitErr(err)
	}
	defer sys.close()
	out := c.App.Writer
	fmt.Fprintf(out, "bench: %d %s jobs, %d submitters, transport %s\n", n, taskType, submitters, transport)
	stopProfile, err := startProfile(c.String("cpuprofile"))
	if err != nil {
		return exitErr(err)
	}
	res, err := runBench(ctx, sys.clients, taskType, n, progressTo(c.App.ErrWriter, n))
	stopProfile()
	if err != nil {
		return exitErr(err)
	}
	fmt.Fprintf(out, "%d jobs in %v: %.0f jobs/s (all submitted after %v)\n", n, res.total.Round(time.Millisecond),
		float64(n)/res.total.Seconds(), res.submitted.Round(time.Millisecond))
	fmt.Fprintf(out, "submit latency p50 %v, p99 %v\n", res.p50.Round(time.Microsecond), res.p99.Round(time.Microsecond))
	return nil
}

// benchTarget connects to the system named by --nats or --connect, or builds one.
func benchTarget(ctx context.Context, c *cli.Context, transport string) (*benchSystem, error) {
	submitters := c.Int("submitters")
	if addr := global(c, "connect"); addr != "" {
		return dialClients(ctx, submitters, func() (*client.Client, error) { return client.DialTCP(ctx, addr) })
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
		return sys, nil
	}
	var reg *metrics.Registry
	if c.Bool("metrics") {
		reg = metrics.New()
	}
	return inProcessSystem(ctx, transport, submitters, c.Int("workers"), c.Int("worker-capacity"), reg)
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

// inProcessSystem starts embedded NATS, a coordinator, the bridge for tcp, and workers
// in a temporary store that is removed afterwards.
func inProcessSystem(ctx context.Context, transport string, submitters, workers, capacity int, reg *metrics.Registry) (*benchSystem, error) {
	dir, err := os.MkdirTemp("", "jobbus-bench-")
	if err != nil {
		return nil, err
	}
	var cleanups []func()
	cleanup := func() {
		for _, f := range slices.Backward(cleanups) {
			f()
		}
		_ = os.RemoveAll(dir)
	}
	fail := func(err error) (*benchSystem, error) { cleanup(); return nil, err }
	srv, err := embeddednats.Start(ctx, embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(dir))
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect()
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, nc.Close)
	cfg := coordinator.DefaultConfig()
	cfg.MaxActiveJobs = 1 << 30
	if reg != nil {
		cfg.Observer = reg.Coordinator()
	}
	coord, err := coordinator.New(nc, cfg)
	if err == nil {
		err = coord.Start(ctx)
	}
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { _ = coord.Close() })
	if reg != nil {
		reg.Coordinator().OnLead(coord)
		cleanups = append(cleanups, scrapeEverySecond(reg))
	}
	var br *bridge.Bridge
	if transport == "tcp" {
		bcfg := bridge.DefaultConfig()
		bcfg.WorkerListen, bcfg.ClientListen = "127.0.0.1:0", "127.0.0.1:0"
		if br, err = bridge.New(nc, bcfg); err == nil {
			err = br.Start(ctx)
		}
		if err != nil {
			return fail(err)
		}
		cleanups = append(cleanups, func() { _ = br.Close() })
		if reg != nil {
			reg.AddBridge(br)
		}
	}
	wctx, stopWorkers := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	cleanups = append(cleanups, func() { stopWorkers(); wg.Wait() })
	// Native peers reach NATS over loopback TCP as they would from another process, so
	// that both transports pay for their sockets.
	url := srv.ClientURL()
	for range workers {
		run, err := benchWorker(url, br, capacity, reg)
		if err != nil {
			return fail(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); run(wctx) }()
	}
	cnc, err := nats.Connect(url)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, cnc.Close)
	dial := func() (*client.Client, error) { return client.New(cnc), nil }
	if br != nil {
		dial = func() (*client.Client, error) { return client.DialTCP(ctx, br.ClientAddr().String()) }
	}
	sys, err := dialClients(ctx, submitters, dial)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, sys.close)
	sys.close = cleanup
	return sys, nil
}

// benchWorker builds one worker: native with its own connection to url, or a spec TCP
// worker on the bridge.
func benchWorker(url string, br *bridge.Bridge, capacity int, reg *metrics.Registry) (func(context.Context), error) {
	if br == nil {
		w, err := worker.Connect(context.Background(), url, worker.WithCapacity(capacity), worker.WithLogger(nil))
		if err != nil {
			return nil, err
		}
		if err := worker.HandleJSON(w, benchCustomType, benchSHA256); err != nil {
			_ = w.Close()
			return nil, err
		}
		if reg != nil {
			reg.AddBus("worker", w.BusStats)
		}
		return func(ctx context.Context) { _ = w.Run(ctx); _ = w.Close() }, nil
	}
	w, err := tcpworker.New(br.WorkerAddr().String(), tcpworker.WithCapacity(capacity), tcpworker.WithLogger(nil))
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) { _ = w.Run(ctx) }, nil
}

type benchResult struct {
	submitted, total time.Duration
	p50, p99         time.Duration
}

// runBench submits n jobs over the clients, one submitter each, then waits until no
// job is active.
func runBench(ctx context.Context, clients []*client.Client, taskType string, n int, progress func(done int)) (benchResult, error) {
	var next, done atomic.Int64
	lat := make([][]time.Duration, len(clients))
	errs := make(chan error, len(clients))
	start := time.Now()
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				if _, err := cl.Submit(ctx, taskType, map[string]string{"text": "jobbus"}); err != nil {
					errs <- err
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
				progress(int(done.Add(1)))
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return benchResult{}, fmt.Errorf("submit: %w", err)
	}
	res := benchResult{submitted: time.Since(start)}
	if err := waitIdle(ctx, clients[0]); err != nil {
		return res, err
	}
	res.total = time.Since(start)
	all := slices.Concat(lat...)
	slices.Sort(all)
	res.p50, res.p99 = all[len(all)/2], all[len(all)*99/100]
	return res, nil
}

// waitIdle polls until no job is QUEUED, RUNNING or in RETRY_WAIT.
func waitIdle(ctx context.Context, cl *client.Client) error {
	for {
		idle := true
		for _, st := range []protocol.State{protocol.StateQueued, protocol.StateRunning, protocol.StateRetryWait} {
			page, err := cl.List(ctx, protocol.ListJobs{State: &st, Limit: 1})
			if err != nil {
				return fmt.Errorf("wait for the jobs to finish: %w", err)
			}
			idle = idle && len(page.Jobs) == 0
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

// startProfile starts a CPU profile into path, if one is asked for.
func startProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
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
