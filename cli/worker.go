package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tcpworker"
)

func workerCommand() *cli.Command {
	var connect string
	return &cli.Command{
		Name:  "worker",
		Usage: "run a worker of the five built-in tasks: native over NATS, or a spec TCP worker (--connect)",
		Description: `By default the worker speaks NATS (the global --nats, default nats://127.0.0.1:4222).
With --connect host:7070 it is the reference TCP worker of docs/PROTOCOL.md on a bridge's worker
port: it registers, heartbeats every --heartbeat-interval-millis (2 s), and after a lost connection interrupts its
running tasks, waits --reconnect-delay-millis and registers again. Task types of your own
are served by a worker you write: docs/task-types.md.

--queues names the queues it serves and their weights: while all have jobs, each gets its
weight's share of the worker's starts (6:3:1 is 60/30/10); --strict-queues takes them in the
order given instead. Without --queues it serves the queue "default".

Example:
   jobbus --nats nats://127.0.0.1:4222 worker --capacity 8
   jobbus worker --queues critical=6,default=3,low=1
   jobbus worker --queues critical,default --strict-queues
   jobbus worker --connect 127.0.0.1:7070 --id edge-1`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "id", Usage: "worker id (default worker-<8 hex>)", EnvVars: env("id")},
			&cli.IntFlag{Name: "capacity", Value: 4, Usage: "tasks run at once (1..1024)", EnvVars: env("capacity")},
			&cli.StringFlag{Name: "connect", Usage: "a bridge's worker port (host:7070): run as a spec TCP worker", EnvVars: env("worker-connect"), Destination: &connect},
			millisFlag("heartbeat-interval-millis", worker.DefaultHeartbeat, "how often the worker heartbeats; keep it well under the coordinator's --heartbeat-timeout-millis"),
			millisFlag("reconnect-delay-millis", tcpworker.DefaultReconnectDelay, "with --connect: wait this long before dialling again"),
			&cli.StringFlag{Name: "queues", Usage: "queues served, with weights: critical=6,default=3,low=1 (default: default)", EnvVars: env("worker-queues")},
			&cli.BoolFlag{Name: "strict-queues", Usage: "take the --queues in the order given (a queue only while those before it have nothing to start) instead of by weight", EnvVars: env("strict-queues")},
			shutdownGraceFlag(),
		},
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			grace, err := shutdownGrace(c)
			if err != nil {
				return err
			}
			var run, drain func(context.Context) error
			if connect != "" {
				// PROTOCOL.md has no way for a worker to say "assign me nothing more", so a
				// spec TCP worker stops at once, as the reference worker does.
				run, err = tcpWorkerRunner(c, log, connect)
			} else {
				run, drain, err = nativeWorkerRunner(c.Context, c, log)
			}
			if err != nil {
				var ec cli.ExitCoder
				if errors.As(err, &ec) {
					return err
				}
				return usageError("%v", err)
			}
			if err := runDraining(c.Context, log, grace, run, drain); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		},
	}
}

func tcpWorkerRunner(c *cli.Context, log *slog.Logger, addr string) (func(context.Context) error, error) {
	qs, err := workerQueues(c)
	if err != nil {
		return nil, err
	}
	opts := []tcpworker.Option{
		tcpworker.WithQueues(qs...), tcpworker.WithStrictQueues(c.Bool("strict-queues")),
		tcpworker.WithCapacity(c.Int("capacity")),
		tcpworker.WithHeartbeat(millis(c, "heartbeat-interval-millis")),
		tcpworker.WithReconnectDelay(millis(c, "reconnect-delay-millis")),
		tcpworker.WithLogger(log),
	}
	if id := c.String("id"); id != "" {
		opts = append(opts, tcpworker.WithID(id))
	}
	w, err := tcpworker.New(addr, opts...)
	if err != nil {
		return nil, err
	}
	log.Info("TCP worker running", "worker", w.ID(), "bridge", addr)
	return w.Run, nil
}

func nativeWorkerRunner(ctx context.Context, c *cli.Context, log *slog.Logger) (run, drain func(context.Context) error, _ error) {
	qs, err := workerQueues(c)
	if err != nil {
		return nil, nil, err
	}
	opts := []worker.Option{
		worker.WithQueues(qs...), worker.WithStrictQueues(c.Bool("strict-queues")),
		worker.WithCapacity(c.Int("capacity")),
		worker.WithHeartbeat(millis(c, "heartbeat-interval-millis")),
		worker.WithLogger(log),
	}
	if id := c.String("id"); id != "" {
		opts = append(opts, worker.WithID(id))
	}
	target, err := natsTarget(c, false)
	if err != nil {
		return nil, nil, err
	}
	tp, flush, err := tracerFromEnv(c, "worker", log)
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, worker.WithTracerProvider(tp))
	opts = append(opts, worker.WithBusOptions(bus.WithNATSOptions(append(embeddednats.ServiceOptions(), target.opts...)...)))
	w, err := worker.Connect(ctx, target.url, opts...)
	if err != nil {
		return nil, nil, err
	}
	log.Info("worker running", "worker", w.ID(), "nats", target.where())
	return func(ctx context.Context) error {
		defer flush()
		defer w.Close()
		return w.Run(ctx)
	}, w.Drain, nil
}

// workerQueues reads --queues and --strict-queues: nil for none (the default queue).
func workerQueues(c *cli.Context) ([]protocol.QueueWeight, error) {
	spec := c.String("queues")
	if spec == "" {
		if c.Bool("strict-queues") {
			return nil, errors.New("--strict-queues needs --queues (the order to take them in)")
		}
		return nil, nil
	}
	qs, err := protocol.ParseQueueWeights(spec)
	if err != nil {
		return nil, fmt.Errorf("--queues: %w", err)
	}
	return qs, nil
}
