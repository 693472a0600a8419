package cli

import (
	"context"
	"log/slog"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/natsurl"
	"github.com/jobbus/jobbus/system"
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
		&cli.IntFlag{Name: "max-scheduled-jobs", Value: d.MaxScheduledJobs, Usage: "SCHEDULED jobs (delayed, snoozed) beyond which delayed submissions are rejected; they do not count against --max-active-jobs", EnvVars: env("max-scheduled-jobs")},
		millisFlag("schedule-window-millis", d.ScheduleWindow, "SCHEDULED jobs due within this are held in memory; later ones only as an index entry, read back when they come within it"),
		millisFlag("aging-step-millis", d.AgingStep, "a queued job gains one priority level per step waited"),
		&cli.DurationFlag{Name: "retention", Value: d.Retention, Usage: "how long a COMPLETED, FAILED or CANCELLED job, and its idempotency key, are kept after it ended (Go duration: 24h, 90s); 0 keeps them forever. Active jobs never expire", EnvVars: env("retention")},
		&cli.IntFlag{Name: "replicas", Value: d.Replicas, Usage: "replicas of the KV buckets it creates: 0 is 3 in a cluster (or its size, if smaller), 1 on a lone server, and keeps what exists. Another count than an existing bucket's is refused without --reconfigure-buckets (docs/deployment.md)", EnvVars: env("replicas")},
		&cli.BoolFlag{Name: "reconfigure-buckets", Usage: "change existing buckets to --replicas (JetStream moves their data) and the leader lease bucket to --leader-lease-millis", EnvVars: env("reconfigure-buckets")},
		millisFlag("leader-lease-millis", d.LeaderLease, "a standby coordinator takes over within this long of the leader's loss; the same for every coordinator (another than the lease bucket's is refused without --reconfigure-buckets)"),
		&cli.StringFlag{Name: "coordinator-id", Usage: "this coordinator's name in the leader lease: restarted after a crash, it takes its lease back at once. Unique to one process at a time; serve keeps one in its store, --data-dir or the --nats-config file's store_dir (default: random per process)", EnvVars: env("coordinator-id")},
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
	cfg.MaxScheduledJobs = c.Int("max-scheduled-jobs")
	cfg.ScheduleWindow = millis(c, "schedule-window-millis")
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
		httpListenFlag(system.DefaultHTTPListen),
		shutdownGraceFlag(),
		&cli.StringFlag{Name: "nats-http-listen", Usage: "monitoring address of the embedded NATS server (/varz, /jsz, /healthz), e.g. 127.0.0.1:8222; off by default", EnvVars: env("nats-http-listen")},
		&cli.StringFlag{Name: "nats-system-user", Value: "sys", Usage: "user of the embedded server's system account, with --nats-system-password", EnvVars: env("nats-system-user")},
		&cli.StringFlag{Name: "nats-system-password", Usage: "give the embedded server a system account user (for nats server report jetstream, nats server ls); off by default", EnvVars: env("nats-system-password")},
		&cli.StringFlag{Name: "nats-user", Usage: "the embedded NATS server requires this user (with --nats-password) of every client, and serve connects as it; with --nats-config, the file's user serve connects as", EnvVars: env("nats-user")},
		&cli.StringFlag{Name: "nats-password", Usage: "the password of --nats-user", EnvVars: env("nats-password")},
		&cli.StringFlag{Name: "nats-token", Usage: "the embedded NATS server requires this token of every client (instead of a user)", EnvVars: env("nats-token")},
		&cli.StringFlag{Name: "nats-config", Usage: "a nats-server configuration file for the embedded server (accounts, users and permissions, nkeys, JWT resolver, TLS): what it sets wins over the --nats-* flags; see docs/security.md and docs/nats-server.conf", EnvVars: env("nats-config")},
		&cli.StringFlag{Name: "nats-max-store", Usage: "cap the embedded server's JetStream file storage (e.g. 512M, 10G; default: 75% of the disk's free space); at the cap, or when the disk fills up first, submissions are refused with an ERROR that says so, and jobs already accepted are kept: see docs/operations.md", EnvVars: env("nats-max-store")},
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
	tp, flush, err := tracerFromEnv(c, "serve", log)
	if err != nil {
		return err
	}
	defer flush()
	cfg.TracerProvider = tp
	// --sync always: a cluster syncs each write, and group commit is its atomic
	// batches; a lone server's coordinator syncs groups of writes itself (NATS.SyncJobs).
	cfg.SyncAlways = c.String("sync") == "always" && !coordinatorSyncs(c)
	if err := cfg.Validate(); err != nil {
		return usageError("%v", err)
	}
	scfg, err := serveSystem(c, log, cfg)
	if err != nil {
		return err
	}
	var running atomic.Pointer[system.System]
	return runDraining(c.Context, log, grace, func(ctx context.Context) error {
		return serveUntil(ctx, c, log, scfg, &running)
	}, func(ctx context.Context) error {
		if sys := running.Load(); sys != nil {
			return sys.Drain(ctx)
		}
		return nil
	})
}

// serveUntil runs the system until ctx ends: on a signal, runDraining drains the local
// workers first (through running), so the coordinator is still there to take their
// results.
func serveUntil(ctx context.Context, c *cli.Context, log *slog.Logger, scfg system.Config, running *atomic.Pointer[system.System]) error {
	sys, err := system.Start(ctx, scfg)
	if err != nil {
		return err
	}
	running.Store(sys)
	if srv := sys.Server(); srv != nil {
		if u := srv.MonitorURL(); u != "" {
			log.Info("NATS monitoring", "url", u)
		}
		warnOpenNATS(log, srv.ListenHost(), srv.ClientURL(), srv.Authenticated())
		log.Info("embedded NATS started", "url", srv.ClientURL(), "data_dir", srv.StoreDir())
		if scfg.NATS.SyncJobs {
			log.Info("--sync always: every job write is fsynced before anything depends on it, writes acknowledged together in one fsync")
		}
	}
	if scfg.Coordinator == nil { // serve_cluster.go: the hub's coordinators serve a leaf node
		log.Info("leaf node: no coordinator here; the hub's serve this site's workers and clients")
	}
	n := scfg.Workers.Count
	log.Info("jobbus serving", "nats", natsurl.Connected(sys.Conn()), "workers", n)
	if n == 0 {
		log.Info("no workers: jobs wait until a worker connects (jobbus worker, or serve --workers N)")
	}
	select {
	case <-ctx.Done():
	case <-sys.Done():
	}
	log.Info("jobbus stopping")
	return sys.Close()
}

// serveSystem maps serve's flags onto the system it runs.
func serveSystem(c *cli.Context, log *slog.Logger, cfg coordinator.Config) (system.Config, error) {
	nats, err := serveNATS(c, log)
	if err != nil {
		return system.Config{}, err
	}
	scfg := system.Config{NATS: nats, HTTPListen: httpListen(c, log), Metrics: true, Logger: log, ReturnIdleMemory: true}
	if !isLeaf(c) {
		scfg.Coordinator = &cfg
	}
	if scfg.Bridge, err = bridgeSystemConfig(c, log); err != nil {
		return system.Config{}, err
	}
	if scfg.Bridge == nil {
		log.Info("TCP ports off")
	}
	capacity, workerLog := c.Int("worker-capacity"), localWorkerLog(c, log)
	scfg.Workers = system.Workers{Count: c.Int("workers"), Options: func() []worker.Option {
		return []worker.Option{worker.WithCapacity(capacity), worker.WithLogger(workerLog), worker.WithTracerProvider(cfg.TracerProvider)}
	}}
	// Every flag is valid: name every address and store in use at once (ports.go).
	return scfg, checkServeFree(c)
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

// serveNATS maps serve's flags onto its NATS: --nats (or --context) joins that, else
// the embedded server's flags configure it.
func serveNATS(c *cli.Context, log *slog.Logger) (system.NATS, error) {
	target, err := natsTarget(c, true)
	if err != nil {
		return system.NATS{}, err
	}
	if target.url != "" {
		for _, f := range []string{"data-dir", "nats-listen", "nats-http-listen", "nats-system-password", "nats-log-level", "nats-max-store", "nats-user", "nats-password", "nats-token", "nats-config",
			"nats-system-user", "server-name", "cluster-name", "cluster-listen", "routes", "leafnode-remote", "leafnode-listen", "sync"} {
			if c.IsSet(f) && givenOnCommandLine(c, f) {
				return system.NATS{}, usageError("--%s configures the embedded NATS server, which serve does not start when it joins %s", f, target.where())
			}
		}
		return joinNATS(c, target), nil
	}
	natsLog, err := loggerAt(c, "nats-log-level", c.String("nats-log-level"))
	if err != nil {
		return system.NATS{}, err
	}
	opts, err := embedClusterOptions(c) // serve_cluster.go
	if err != nil {
		return system.NATS{}, err
	}
	opts = append(opts,
		embeddednats.WithListen(c.String("nats-listen")),
		embeddednats.WithLogger(natsLog),
		embeddednats.WithStoreGuard(embeddednats.DefaultStoreCheck, embeddednats.DefaultStoreProbe),
	)
	syncOpts, err := syncOptions(c.String("sync"), lone(c))
	if err != nil {
		return system.NATS{}, err
	}
	opts = append(opts, syncOpts...)
	if hp := c.String("nats-http-listen"); hp != "" {
		opts = append(opts, embeddednats.WithHTTPListen(hp))
	}
	maxStore, err := parseSize(c.String("nats-max-store"))
	if err != nil {
		return system.NATS{}, usageError("--nats-max-store: %v", err)
	}
	if maxStore > 0 {
		opts = append(opts, embeddednats.WithJetStreamLimits(0, maxStore))
	}
	auth, connAuth, err := embeddedAuth(c)
	if err != nil {
		return system.NATS{}, err
	}
	opts = append(opts, auth...)
	if c.String("nats-system-password") == "" && givenOnCommandLine(c, "nats-system-user") {
		return system.NATS{}, usageError("--nats-system-user needs --nats-system-password (or JOBBUS_NATS_SYSTEM_PASSWORD)")
	}
	if pw := c.String("nats-system-password"); pw != "" {
		opts = append(opts, embeddednats.WithSystemUser(c.String("nats-system-user"), pw))
	}
	return system.NATS{
		Options: connAuth, Name: "jobbus serve",
		Server: opts, StoreDir: c.String("data-dir"), WaitForStore: true,
		SyncJobs: coordinatorSyncs(c), AnswerServers: true, // serve_cluster.go: for jobbus cluster
	}, nil
}

// joinNATS is the NATS of a command that joins target: serve with --nats, coordinator,
// bridge, dashboard.
func joinNATS(c *cli.Context, target natsConn) system.NATS {
	return system.NATS{URL: target.url, Options: target.opts, Name: "jobbus " + c.Command.Name}
}

// untilStopped waits until ctx ends or sys stopped by itself, then closes sys.
func untilStopped(ctx context.Context, sys *system.System) error {
	select {
	case <-ctx.Done():
	case <-sys.Done():
	}
	return sys.Close()
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
			tp, flush, err := tracerFromEnv(c, "coordinator", log)
			if err != nil {
				return err
			}
			defer flush()
			cfg.TracerProvider = tp
			target, err := natsTarget(c, false)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			sys, err := system.Start(ctx, system.Config{
				NATS: joinNATS(c, target), Coordinator: &cfg, HTTPListen: httpListen(c, log), Metrics: true, Logger: log,
				ReturnIdleMemory: true,
			})
			if err != nil {
				return err
			}
			log.Info("coordinator campaigning", "nats", natsurl.Connected(sys.Conn()))
			return untilStopped(ctx, sys)
		},
	}
}
