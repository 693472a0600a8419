package cli

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/worker"
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

// drainGroup drains several workers at once: serve's local workers.
type drainGroup struct {
	mu      sync.Mutex
	workers []*worker.Worker
}

func (g *drainGroup) add(w *worker.Worker) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.workers = append(g.workers, w)
}

// drain drains every worker, returning the first error (ctx's, when the grace ran out).
func (g *drainGroup) drain(ctx context.Context) error {
	g.mu.Lock()
	ws := append([]*worker.Worker(nil), g.workers...)
	g.mu.Unlock()
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { errs[i] = w.Drain(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
