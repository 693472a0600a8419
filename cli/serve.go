package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/httpserver"
	"github.com/jobbus/jobbus/internal/metrics"
	"github.com/jobbus/jobbus/worker"
)

func millisFlag(name string, def time.Duration, usage string) cli.Flag {
	return &cli.Int64Flag{Name: name, Value: def.Milliseconds(), Usage: usage, EnvVars: env(name)}
}

// millis reads a millisFlag.
func millis(c *cli.Context, name string) time.Duration {
	return time.Duration(c.Int64(name)) * time.Millisecond
}

func coordinatorFlags() []cli.Flag {
	d := coordinator.DefaultConfig()
	return []cli.Flag{
		millisFlag("heartbeat-timeout-millis", d.HeartbeatTimeout, "a worker silent this long is lost"),
		millisFlag("sweep-interval-millis", d.SweepInterval, "how often deadlines, retries and silent workers are checked"),
		millisFlag("task-timeout-millis", d.TaskTimeout, "execution deadline of one attempt"),
		&cli.IntFlag{Name: "max-attempts", Value: d.MaxAttempts, Usage: "attempts of a job submitted with maxAttempts <= 0", EnvVars: env("max-attempts")},
		millisFlag("retry-base-delay-millis", d.RetryBaseDelay, "first retry delay; doubles per attempt"),
		millisFlag("retry-max-delay-millis", d.RetryMaxDelay, "longest retry delay"),
		&cli.IntFlag{Name: "max-active-jobs", Value: d.MaxActiveJobs, Usage: "QUEUED + RETRY_WAIT + RUNNING jobs beyond which submissions are rejected", EnvVars: env("max-active-jobs")},
		millisFlag("aging-step-millis", d.AgingStep, "a queued job gains one priority level per step waited"),
		&cli.DurationFlag{Name: "retention", Value: d.Retention, Usage: "how long a COMPLETED, FAILED or CANCELLED job, and its idempotency key, are kept after it ended (Go duration: 24h, 90s); 0 keeps them forever. Active jobs never expire", EnvVars: env("retention")},
		&cli.IntFlag{Name: "replicas", Value: d.Replicas, Usage: "replicas of the KV buckets it creates: 0 is 3 in a cluster (or its size, if smaller), 1 on a lone server, and keeps what exists. Another count than an existing bucket's is refused without --reconfigure-buckets (docs/deployment.md)", EnvVars: env("replicas")},
		&cli.BoolFlag{Name: "reconfigure-buckets", Usage: "change existing buckets to --replicas (JetStream moves their data)", EnvVars: env("reconfigure-buckets")},
		millisFlag("leader-lease-millis", d.LeaderLease, "a standby coordinator takes over within this long of the leader's loss"),
		&cli.StringFlag{Name: "coordinator-id", Usage: "this coordinator's name in the leader lease: restarted after a crash, it takes its lease back at once. Unique to one process at a time; serve keeps one in --data-dir (default: random per process)", EnvVars: env("coordinator-id")},
	}
}

func coordinatorConfig(c *cli.Context, log *slog.Logger) coordinator.Config {
	cfg := coordinator.DefaultConfig()
	cfg.HeartbeatTimeout = millis(c, "heartbeat-timeout-millis")
	cfg.SweepInterval = millis(c, "sweep-interval-millis")
	cfg.TaskTimeout = millis(c, "task-timeout-millis")
	cfg.MaxAttempts = c.Int("max-attempts")
	cfg.RetryBaseDelay = millis(c, "retry-base-delay-millis")
	cfg.RetryMaxDelay = millis(c, "retry-max-delay-millis")
	cfg.MaxActiveJobs = c.Int("max-active-jobs")
	cfg.AgingStep = millis(c, "aging-step-millis")
	cfg.Retention = c.Duration("retention")
	cfg.Replicas = c.Int("replicas")
	cfg.ReconfigureBuckets = c.Bool("reconfigure-buckets")
	cfg.LeaderLease = millis(c, "leader-lease-millis")
	cfg.ID = c.String("coordinator-id")
	cfg.Logger = log
	return cfg
}

func serveCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "data-dir", Value: embeddednats.DefaultStoreDir, Usage: "where the embedded NATS server keeps JetStream", EnvVars: env("data-dir")},
		&cli.StringFlag{Name: "nats-listen", Value: embeddednats.DefaultListen, Usage: "client address of the embedded NATS server (loopback by default)", EnvVars: env("nats-listen")},
		&cli.IntFlag{Name: "workers", Value: 0, Usage: "local native workers to run in-process", EnvVars: env("workers")},
		&cli.IntFlag{Name: "worker-capacity", Value: 4, Usage: "capacity of each local worker", EnvVars: env("worker-capacity")},
		httpListenFlag(httpserver.DefaultListen),
		shutdownGraceFlag(),
		&cli.StringFlag{Name: "nats-http-listen", Usage: "monitoring address of the embedded NATS server (/varz, /jsz, /healthz), e.g. 127.0.0.1:8222; off by default", EnvVars: env("nats-http-listen")},
		&cli.StringFlag{Name: "nats-system-user", Value: "sys", Usage: "user of the embedded server's system account, with --nats-system-password", EnvVars: env("nats-system-user")},
		&cli.StringFlag{Name: "nats-system-password", Usage: "give the embedded server a system account user (for nats server report jetstream, nats server ls); off by default", EnvVars: env("nats-system-password")},
		&cli.StringFlag{Name: "nats-user", Usage: "the embedded NATS server requires this user (with --nats-password) of every client, and serve connects as it; with --nats-config, the file's user serve connects as", EnvVars: env("nats-user")},
		&cli.StringFlag{Name: "nats-password", Usage: "the password of --nats-user", EnvVars: env("nats-password")},
		&cli.StringFlag{Name: "nats-token", Usage: "the embedded NATS server requires this token of every client (instead of a user)", EnvVars: env("nats-token")},
		&cli.StringFlag{Name: "nats-config", Usage: "a nats-server configuration file for the embedded server (accounts, users and permissions, nkeys, JWT resolver, TLS): what it sets wins over the --nats-* flags; see docs/security.md and docs/nats-server.conf", EnvVars: env("nats-config")},
		&cli.StringFlag{Name: "nats-max-store", Usage: "cap the embedded server's JetStream file storage (e.g. 512M, 10G; default: 75% of the disk's free space); at the cap, or when the disk fills up first, submissions are refused with an ERROR that says so and running jobs go on: see docs/operations.md", EnvVars: env("nats-max-store")},
		&cli.StringFlag{Name: "sync", Value: "default", Usage: syncFlagUsage, EnvVars: env("sync")},
		&cli.StringFlag{Name: "nats-log-level", Value: "warn", Usage: "the embedded NATS server's own log lines at this level and above (debug, info, warn, error): --log-level debug stays jobbus's", EnvVars: env("nats-log-level")},
	}
	return &cli.Command{
		Name:  "serve",
		Usage: "run the whole system: embedded NATS, the coordinator and optional local workers",
		Description: `Starts an embedded NATS server with JetStream (store in --data-dir), the coordinator,
and --workers local native workers. With the global --nats URL it joins that server instead.
Before it starts it names every address (and the store) another process holds, with the
flag that moves each.

More: docs/operations.md (configuration, stopping, dashboard and metrics, a full disk),
docs/deployment.md (clusters and leaf nodes), docs/security.md (users, TLS).

Example:
   jobbus serve --workers 2`,
		Flags:  append(append(append(flags, serveClusterFlags()...), coordinatorFlags()...), bridgeFlags()...),
		Action: serve,
	}
}

func serve(c *cli.Context) error {
	log, err := logger(c)
	if err != nil {
		return err
	}
	grace, err := shutdownGrace(c)
	if err != nil {
		return err
	}
	if err := checkLocalWorkers(c, 0); err != nil {
		return err
	}
	cfg := coordinatorConfig(c, log)
	// --sync always: a cluster syncs each write, and group commit is its atomic
	// batches; a lone server's coordinator syncs groups of writes itself (serveUntil).
	cfg.SyncAlways = c.String("sync") == "always" && !coordinatorSyncs(c)
	if err := cfg.Validate(); err != nil {
		return usageError("%v", err)
	}
	var local drainGroup
	return runDraining(c.Context, log, grace, func(ctx context.Context) error {
		return serveUntil(ctx, c, log, cfg, &local)
	}, local.drain)
}

// serveUntil runs the system until ctx ends: on a signal, runDraining drains the local
// workers first, so the coordinator is still there to take their results.
func serveUntil(ctx context.Context, c *cli.Context, log *slog.Logger, cfg coordinator.Config, local *drainGroup) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	// The embedded server's store guard tells the coordinator of a failed disk.
	var srv *embeddednats.Server
	nc, shutdown, err := connectOrEmbed(ctx, c, log, func(s *embeddednats.Server) { srv, cfg.StoreFault = s, s.StoreFault })
	if err != nil {
		return err
	}
	if srv != nil && coordinatorSyncs(c) {
		cfg.SyncJobs = jobsSync(srv, nc)
		log.Info("--sync always: every job write is fsynced before anything depends on it, writes acknowledged together in one fsync")
	}
	defer shutdown()
	if cfg.ID == "" && global(c, "nats") == "" && global(c, "context") == "" {
		// The embedded store is locked to this process, so an identity kept in it is
		// this process's alone: after a crash, the coordinator takes its lease back.
		if cfg.ID, err = storedCoordinatorID(c.String("data-dir")); err != nil {
			return err
		}
	}
	reg := metrics.New()
	stopHTTP, err := startHTTP(ctx, c, nc, log, reg)
	if err != nil {
		return err
	}
	defer stopHTTP()
	cfg.Observer = reg.Coordinator()
	run := runCoordinator
	if isLeaf(c) { // serve_cluster.go: the hub's coordinators serve a leaf node
		run = noCoordinator(log)
	}
	coordDone := run(ctx, nc, cfg, reg.Coordinator().OnLead)
	bnc, closeBNC := serveBridgeConn(ctx, c, nc, log)
	defer closeBNC()
	stopBridge, err := startBridge(ctx, c, bnc, log, reg.AddBridge)
	if err != nil {
		stop()
		<-coordDone
		return err
	}
	defer stopBridge()
	// Local workers beat often enough for the coordinator they serve, however short its
	// heartbeat timeout is set.
	heartbeat := min(worker.DefaultHeartbeat, cfg.HeartbeatTimeout/3)
	n := c.Int("workers")
	wg := runLocalWorkers(ctx, nc, n, localWorkerLog(c, log), func(w *worker.Worker) {
		reg.AddBus("worker", w.BusStats)
		local.add(w)
	}, worker.WithCapacity(c.Int("worker-capacity")), worker.WithHeartbeat(heartbeat))
	log.Info("jobbus serving", "nats", nc.ConnectedUrlRedacted(), "workers", n)
	if n == 0 {
		log.Info("no workers: jobs wait until a worker connects (jobbus worker, or serve --workers N)")
	}
	select {
	case <-ctx.Done():
	case err = <-coordDone:
		stop()
	}
	log.Info("jobbus stopping")
	wg.Wait()
	if err == nil {
		err = <-coordDone
	}
	return err
}

// localWorkerLog is the log of serve's own workers: the coordinator already says each
// registers, so below debug they say only what goes wrong.
func localWorkerLog(c *cli.Context, log *slog.Logger) *slog.Logger {
	if log.Enabled(c.Context, slog.LevelDebug) {
		return log
	}
	return slog.New(minLevel{log.Handler(), slog.LevelWarn})
}

// minLevel passes on the records of h at or above level.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.level && m.Handler.Enabled(ctx, l)
}

func (m minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{m.Handler.WithAttrs(attrs), m.level}
}

func (m minLevel) WithGroup(name string) slog.Handler {
	return minLevel{m.Handler.WithGroup(name), m.level}
}

// runCoordinator campaigns for leadership and coordinates while leading, until ctx
// ends; the channel gets its error, or nil.
func runCoordinator(ctx context.Context, nc *nats.Conn, cfg coordinator.Config, onLead func(*coordinator.Coordinator)) <-chan error {
	done := make(chan error, 1)
	go func() { done <- coordinator.Run(ctx, nc, cfg, onLead) }()
	return done
}

// connectOrEmbed joins --nats, or starts the embedded server, hands it to embedded, and
// connects in-process.
func connectOrEmbed(ctx context.Context, c *cli.Context, log *slog.Logger, embedded func(*embeddednats.Server)) (*nats.Conn, func(), error) {
	target, err := natsTarget(c, true)
	if err != nil {
		return nil, nil, err
	}
	if target.url != "" {
		for _, f := range []string{"data-dir", "nats-listen", "nats-http-listen", "nats-system-password", "nats-log-level", "nats-max-store", "nats-user", "nats-password", "nats-token", "nats-config",
			"server-name", "cluster-listen", "routes", "leafnode-remote", "leafnode-listen", "sync"} {
			if c.IsSet(f) && givenOnCommandLine(c, f) {
				return nil, nil, usageError("--%s configures the embedded NATS server, which serve does not start when it joins %s", f, target.where())
			}
		}
		if err := checkFree(servePorts(c, false), ""); err != nil { // ports.go: every port in use at once
			return nil, nil, err
		}
		nc, err := dial(ctx, c, log, target)
		if err != nil {
			return nil, nil, err
		}
		return nc, nc.Close, nil
	}
	natsLog, err := loggerAt(c, "nats-log-level", c.String("nats-log-level"))
	if err != nil {
		return nil, nil, err
	}
	opts, err := embedClusterOptions(c) // serve_cluster.go
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts,
		embeddednats.WithListen(c.String("nats-listen")),
		embeddednats.WithStoreDir(c.String("data-dir")),
		embeddednats.WithLogger(natsLog),
		embeddednats.WithStoreGuard(embeddednats.DefaultStoreCheck, embeddednats.DefaultStoreProbe),
	)
	syncOpts, err := syncOptions(c.String("sync"), lone(c))
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, syncOpts...)
	if hp := c.String("nats-http-listen"); hp != "" {
		opts = append(opts, embeddednats.WithHTTPListen(hp))
	}
	maxStore, err := parseSize(c.String("nats-max-store"))
	if err != nil {
		return nil, nil, usageError("--nats-max-store: %v", err)
	}
	if maxStore > 0 {
		opts = append(opts, embeddednats.WithJetStreamLimits(0, maxStore))
	}
	auth, connAuth, err := embeddedAuth(c)
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, auth...)
	if c.String("nats-system-password") == "" && givenOnCommandLine(c, "nats-system-user") {
		return nil, nil, usageError("--nats-system-user needs --nats-system-password (or JOBBUS_NATS_SYSTEM_PASSWORD)")
	}
	if pw := c.String("nats-system-password"); pw != "" {
		opts = append(opts, embeddednats.WithSystemUser(c.String("nats-system-user"), pw))
	}
	if err := checkServeFree(c); err != nil { // ports.go: every port and the store in use, at once
		return nil, nil, err
	}
	srv, err := startEmbedded(ctx, log, opts) // serve_store.go
	if err != nil {
		return nil, nil, err
	}
	embedded(srv)
	if u := srv.MonitorURL(); u != "" {
		log.Info("NATS monitoring", "url", u)
	}
	warnOpenNATS(log, srv.ListenHost(), srv.ClientURL(), srv.Authenticated())
	nc, err := srv.Connect(append([]nats.Option{nats.Name("jobbus serve")}, connAuth...)...)
	if err != nil {
		_ = srv.Shutdown(context.Background())
		return nil, nil, fmt.Errorf("connect to embedded NATS: %w", err)
	}
	log.Info("embedded NATS started", "url", srv.ClientURL(), "data_dir", c.String("data-dir"))
	stopInfo := answerServerInfo(nc, srv, log) // serve_cluster.go: for jobbus cluster
	return nc, func() {
		stopInfo()
		nc.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("embedded NATS shutdown", "err", err)
		}
	}, nil
}

// dial connects a service (serve on --nats, coordinator, bridge) to target and checks
// that it offers JetStream.
// It waits for NATS and its JetStream to answer (a service started with its cluster),
// then keeps reconnecting, to any server of the cluster, for as long as it runs.
func dial(ctx context.Context, c *cli.Context, log *slog.Logger, target natsConn) (*nats.Conn, error) {
	return embeddednats.Dial(ctx, target.url,
		embeddednats.WithName("jobbus "+c.Command.Name),
		embeddednats.WithWait(log),
		embeddednats.WithNATSOptions(embeddednats.ServiceOptions()...),
		embeddednats.WithNATSOptions(target.opts...))
}

// runLocalWorkers starts n native workers on nc, showing each to onWorker; the returned
// group ends when ctx does.
func runLocalWorkers(ctx context.Context, nc *nats.Conn, n int, log *slog.Logger, onWorker func(*worker.Worker), opts ...worker.Option) *sync.WaitGroup {
	opts = append(opts, worker.WithLogger(log))
	var wg sync.WaitGroup
	for range n {
		w, err := worker.New(nc, opts...)
		if err != nil {
			log.Error("local worker", "err", err)
			continue
		}
		onWorker(w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Close()
			if err := w.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				log.Error("local worker stopped", "worker", w.ID(), "err", err)
			}
		}()
	}
	return &wg
}

func coordinatorCommand() *cli.Command {
	return &cli.Command{
		Name:  "coordinator",
		Usage: "run only the coordinator, on an existing NATS server (--nats)",
		Description: `Several coordinators on one NATS elect one leader through a lease in KV; the
others stand by and take over within --leader-lease-millis of its loss.

More: docs/deployment.md (shapes, failover, buckets and replicas), docs/operations.md.

Example:
   jobbus --nats nats://127.0.0.1:4222 coordinator`,
		Flags: append(coordinatorFlags(), httpListenFlag("")),
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			cfg := coordinatorConfig(c, log) // a usage error is one before any connection
			if err := cfg.Validate(); err != nil {
				return usageError("%v", err)
			}
			target, err := natsTarget(c, false)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			nc, err := dial(ctx, c, log, target)
			if err != nil {
				return err
			}
			defer nc.Close()
			reg := metrics.New()
			stopHTTP, err := startHTTP(ctx, c, nc, log, reg)
			if err != nil {
				return err
			}
			defer stopHTTP()
			cfg.Observer = reg.Coordinator()
			log.Info("coordinator campaigning", "nats", nc.ConnectedUrlRedacted())
			return <-runCoordinator(ctx, nc, cfg, reg.Coordinator().OnLead)
		},
	}
}
