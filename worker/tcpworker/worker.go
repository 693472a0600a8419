// Package tcpworker is the reference spec worker of PROTOCOL.md: it speaks the framed
// TCP protocol of the worker port (default 7070) to a jobbus bridge, or to any
// coordinator that speaks the spec.
//
// A Worker dials, registers (WORKER_REGISTER must be its first frame), heartbeats,
// runs every TASK_ASSIGN it is sent in a goroutine of its own and answers each with a
// TASK_RESULT that echoes the lease. A TASK_CANCEL touches only the attempt whose job
// and attempt id it names. When the connection is lost the worker interrupts the
// attempts in flight (the coordinator has already revoked their leases, so their
// results are dropped), waits the reconnect delay, dials again and registers again. A
// connection whose peer stops acknowledging what the worker writes for two heartbeat
// intervals counts as lost too (on Linux: TCP_USER_TIMEOUT), so that an attempt does
// not run on beside its retry when the coordinator vanished without closing the
// connection.
//
//	w, err := tcpworker.New("127.0.0.1:7070", tcpworker.WithCapacity(8))
//	...
//	err = w.Run(ctx) // until ctx ends
package tcpworker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jobbus/jobbus/internal/backoff"
	"github.com/jobbus/jobbus/worker/internal/attempts"
)

var (
	// ErrStarted is returned by a second call of Run: a Worker runs once.
	ErrStarted = errors.New("tcpworker: already started")
	// ErrRegistrationRefused means the coordinator answered WORKER_REGISTER with an
	// ERROR. Retrying the same registration cannot help, so Run returns it.
	ErrRegistrationRefused = errors.New("tcpworker: registration refused")
	// ErrProtocol means the coordinator sent a frame the worker port does not allow;
	// the worker drops that connection and dials again.
	ErrProtocol = errors.New("tcpworker: protocol violation")
)

// Worker runs attempts for a coordinator reached over TCP. Create it with New and call
// Run once. Its methods are safe for concurrent use.
type Worker struct {
	addr string
	cfg  config
	log  *slog.Logger

	started atomic.Bool

	// attempts are the attempts executing now. Sessions run one at a time, and each
	// waits for its attempts before the next begins.
	attempts *attempts.Set
}

// New returns a worker for the coordinator's worker port at addr (host:port). It does
// not dial: Run does.
func New(addr string, opts ...Option) (*Worker, error) {
	cfg, err := newConfig(addr, opts)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("worker", cfg.ID, "addr", addr)
	return &Worker{
		addr:     addr,
		cfg:      cfg,
		log:      log,
		attempts: attempts.New(cfg.Registry, cfg.Capacity, log),
	}, nil
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// Running is the number of attempts executing now.
func (w *Worker) Running() int { return w.attempts.Len() }

// Run serves the coordinator until ctx ends, then interrupts the running attempts and
// returns nil once every goroutine it started has ended. A dial failure or a lost
// connection is retried after the reconnect delay; only a refused registration
// (ErrRegistrationRefused, naming the coordinator's message) ends Run early.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return ErrStarted
	}
	defer func() {
		// Each session waited for its attempts; this ends their goroutines too.
		w.attempts.Shutdown(context.Canceled)
		w.attempts.Wait()
	}()
	for try := 1; ; try++ {
		registered, err := w.session(ctx)
		switch {
		case errors.Is(err, ErrRegistrationRefused):
			w.log.Error("worker registration refused", "err", err)
			return err
		case ctx.Err() != nil:
			w.log.Info("worker stopped")
			return nil
		case registered:
			try = 0 // the next failure is the first of a new outage
			w.log.Warn("connection to the coordinator lost; reconnecting", "err", err, "delay", w.cfg.reconnectDelay)
		case try == 1:
			w.log.Info("waiting for the coordinator", "err", err, "delay", w.cfg.reconnectDelay)
		default:
			w.log.Debug("coordinator still unreachable", "err", err, "try", try)
		}
		if !backoff.Sleep(ctx, w.cfg.reconnectDelay) {
			w.log.Info("worker stopped")
			return nil
		}
	}
}

// session dials, registers and serves one connection until it ends. registered
// reports whether the registration was acknowledged.
func (w *Worker) session(ctx context.Context) (registered bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, w.cfg.dialTimeout)
	conn, err := w.cfg.dial(dctx, "tcp", w.addr)
	cancel()
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", w.addr, err)
	}
	if err := abortWhenUnacknowledged(conn, w.silenceLimit()); err != nil {
		w.log.Debug("cannot bound how long the connection may go unacknowledged", "err", err)
	}
	s := newSession(w, conn)
	return s.run(ctx)
}

// silenceLimit is how long what the worker writes (a heartbeat every interval, at
// least) may go unacknowledged by the coordinator's side of the connection before the
// worker counts the connection lost: two heartbeat intervals, and at least a second.
//
// Why: PROTOCOL.md voids the attempts of a worker whose connection is gone, and the
// coordinator loses a silent worker after its heartbeat timeout (three intervals, by
// the reference defaults) and runs the job again elsewhere. A connection whose peer
// vanished without closing it (its host down, the network cut, a NAT entry dropped)
// gives no error to a worker that only writes heartbeats until the kernel gives up
// retransmitting, many minutes later: the worker's task would run on beside the
// retry. With the limit the kernel aborts the connection about when the coordinator
// loses the worker, the next read fails, and the session interrupts its attempts.
func (w *Worker) silenceLimit() time.Duration {
	return max(2*w.cfg.Heartbeat, time.Second)
}
