package cli

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
)

// defaultShutdownGrace is how long running jobs may take to finish once a worker or
// serve is told to stop (Asynq waits 8 s; Kubernetes sends SIGKILL 30 s after SIGTERM).
const defaultShutdownGrace = 10 * time.Second

func shutdownGraceFlag() cli.Flag {
	return &cli.DurationFlag{
		Name:    "shutdown-grace",
		Value:   defaultShutdownGrace,
		Usage:   "on SIGTERM or Ctrl-C, take no new jobs and let running ones finish for up to this long, then cancel them; a second signal stops at once (0: stop at once)",
		EnvVars: env("shutdown-grace"),
	}
}

func shutdownGrace(c *cli.Context) (time.Duration, error) {
	g := c.Duration("shutdown-grace")
	if g < 0 {
		return 0, usageError("--shutdown-grace must be 0 or more, got %v", g)
	}
	return g, nil
}

// runDraining runs run until it returns or a SIGINT or SIGTERM arrives. On the signal
// it drains (drain's context ends after grace, or at a second signal), then ends run's
// context and returns what run returns. A nil drain stops at once.
func runDraining(parent context.Context, log *slog.Logger, grace time.Duration, run, drain func(context.Context) error) error {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, stop := context.WithCancel(parent)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()

	select {
	case err := <-done:
		return err
	case <-parent.Done():
		stop()
		return <-done
	case sig := <-sigs:
		if drain == nil || grace == 0 {
			log.Info("stopping", "signal", sig.String())
			stop()
			return <-done
		}
		log.Info("draining: no new jobs; running ones may finish (signal again to stop now)", "signal", sig.String(), "grace", grace)
	}
	dctx, dcancel := context.WithTimeout(ctx, grace)
	defer dcancel()
	drained := make(chan error, 1)
	go func() { drained <- drain(dctx) }()
	select {
	case err := <-drained:
		if err != nil {
			log.Warn("shutdown grace over: cancelling what still runs", "grace", grace)
		}
	case <-sigs:
		log.Warn("second signal: stopping now, cancelling what still runs")
		dcancel()
		<-drained
	case err := <-done:
		dcancel()
		<-drained
		return err
	}
	stop()
	return <-done
}
