package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/internal/backoff"
	"github.com/jobbus/jobbus/internal/workerproto"
)

// Drain stops the worker taking new attempts and waits until the attempts it runs have
// finished and their results are acknowledged, or ctx ends, returning ctx's error then.
// Run goes on meanwhile, heartbeating, so the coordinator keeps the worker's leases;
// end Run's context afterwards, which cancels whatever still runs.
//
// This is a graceful stop: a deploy that drains costs a running job no attempt. The
// coordinator learns of the drain (PathDrain), assigns the worker nothing more, and
// says how many attempts it still counts as running here, assignments on their way
// included; Drain returns once that is none and nothing runs here. A coordinator that
// forgot the worker (a restart, a failover) has ended its leases: nothing of the
// worker's counts any more.
func (w *Worker) Drain(ctx context.Context) error {
	if !w.draining.Swap(true) {
		w.log.Info("worker draining: no new attempts; waiting for the running ones", "running", w.attempts.Len())
	}
	b := backoff.Policy{Base: w.cfg.retryBase, Max: w.cfg.Heartbeat}.Start()
	for {
		select {
		case <-w.inflight.idle():
		case <-ctx.Done():
			return ctx.Err()
		}
		running, err := w.sendDrain(ctx)
		switch {
		case err == nil && running == 0, errors.Is(err, bus.CodeNotFound):
			w.log.Info("worker drained")
			return nil
		case err == nil:
			w.log.Debug("drain: assignments still on their way", "running", running)
		case errors.Is(err, bus.ErrClosed):
			return fmt.Errorf("worker: drain: %w", err)
		}
		if !b.Wait(ctx) {
			return ctx.Err()
		}
	}
}

// sendDrain tells the coordinator the worker is draining, once it is, and returns how
// many attempts the coordinator counts as running here. The serve loop calls it too,
// until the coordinator has heard it: after every registration, the coordinator sees a
// fresh worker.
func (w *Worker) sendDrain(ctx context.Context) (running int, err error) {
	if !w.draining.Load() {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Heartbeat)
	defer cancel()
	running, err = workerproto.Drain(ctx, w.node, w.cfg.ID)
	switch {
	case err == nil:
		w.drainSent.Store(true)
	case errors.Is(err, bus.CodeNotFound):
		w.log.Debug("drain: coordinator does not know the worker", "err", err)
	default:
		w.log.Debug("drain not answered", "err", err)
	}
	return running, err
}

// inflight counts the attempts started and not yet done with: running, or delivering
// their result.
type inflight struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed while n == 0
}

func newInflight() *inflight {
	z := make(chan struct{})
	close(z)
	return &inflight{zero: z}
}

func (f *inflight) add() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		f.zero = make(chan struct{})
	}
	f.n++
}

func (f *inflight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.n == 0 {
		close(f.zero)
	}
}

// idle is closed once nothing is in flight.
func (f *inflight) idle() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.zero
}
