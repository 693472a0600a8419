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
		&cli.IntFlag{Name: "replicas", Value: d.Replicas, Usage: "replicas of the KV buckets (3 in a cluster)", EnvVars: env("replicas")},
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
	}
	return &cli.Command{
		Name:  "serve",
		Usage: "run the whole system: embedded NATS, the coordinator and optional local workers",
		Description: `Starts an embedded NATS server with JetStream (store in --data-dir), the coordinator,
and --workers local native workers. With the global --nats URL it joins that server instead.

Example:
   jobbus serve --workers 2`,
		Flags:  append(append(flags, coordinatorFlags()...), bridgeFlags()...),
		Action: serve,
	}
}

func serve(c *cli.Context) error {
	log, err := logger(c)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	nc, shutdown, err := connectOrEmbed(ctx, c, log)
	if err != nil {
		return err
	}
	defer shutdown()
	cfg := coordinatorConfig(c, log)
	if err := cfg.Validate(); err != nil {
		return usageError("%v", err)
	}
	if cfg.ID == "" && global(c, "nats") == "" {
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
	coordDone := runCoordinator(ctx, nc, cfg, reg.Coordinator().OnLead)
	stopBridge, err := startBridge(ctx, c, nc, log, reg.AddBridge)
	if err != nil {
		stop()
		<-coordDone
		return err
	}
	defer stopBridge()
	// Local workers beat often enough for the coordinator they serve, however short its
	// heartbeat timeout is set.
	heartbeat := min(worker.DefaultHeartbeat, cfg.HeartbeatTimeout/3)
	wg := runLocalWorkers(ctx, nc, c.Int("workers"), log, func(w *worker.Worker) { reg.AddBus("worker", w.BusStats) },
		worker.WithCapacity(c.Int("worker-capacity")), worker.WithHeartbeat(heartbeat))
	log.Info("jobbus serving", "nats", nc.ConnectedUrlRedacted(), "workers", c.Int("workers"))
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

// runCoordinator campaigns for leadership and coordinates while leading, until ctx
// ends; the channel gets its error, or nil.
func runCoordinator(ctx context.Context, nc *nats.Conn, cfg coordinator.Config, onLead func(*coordinator.Coordinator)) <-chan error {
	done := make(chan error, 1)
	go func() { done <- coordinator.Run(ctx, nc, cfg, onLead) }()
	return done
}

// connectOrEmbed joins --nats, or starts the embedded server and connects in-process.
func connectOrEmbed(ctx context.Context, c *cli.Context, log *slog.Logger) (*nats.Conn, func(), error) {
	target, err := natsTarget(c, true)
	if err != nil {
		return nil, nil, err
	}
	if target.url != "" {
		nc, err := dial(ctx, c, target)
		if err != nil {
			return nil, nil, err
		}
		return nc, nc.Close, nil
	}
	srv, err := embeddednats.Start(ctx,
		embeddednats.WithListen(c.String("nats-listen")),
		embeddednats.WithStoreDir(c.String("data-dir")),
		embeddednats.WithLogger(log))
	if err != nil {
		return nil, nil, err
	}
	nc, err := srv.Connect(nats.Name("jobbus serve"))
	if err != nil {
		_ = srv.Shutdown(context.Background())
		return nil, nil, fmt.Errorf("connect to embedded NATS: %w", err)
	}
	log.Info("embedded NATS started", "url", srv.ClientURL(), "data_dir", c.String("data-dir"))
	return nc, func() {
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
func dial(ctx context.Context, c *cli.Context, target natsConn) (*nats.Conn, error) {
	return embeddednats.Dial(ctx, target.url,
		embeddednats.WithName("jobbus "+c.Command.Name),
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

Example:
   jobbus --nats nats://127.0.0.1:4222 coordinator`,
		Flags: append(coordinatorFlags(), httpListenFlag("")),
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			target, err := natsTarget(c, false)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			nc, err := dial(ctx, c, target)
			if err != nil {
				return err
			}
			defer nc.Close()
			cfg := coordinatorConfig(c, log)
			if err := cfg.Validate(); err != nil {
				return usageError("%v", err)
			}
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
