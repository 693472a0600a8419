// Package worker is the native jobbus worker: it registers with the coordinator over
// the bus, heartbeats, runs the attempts the coordinator assigns (up to its capacity,
// each in a goroutine of its own, cancellable), and reports every outcome until the
// coordinator acknowledges it as durable.
//
// A worker only dials out, to NATS: the coordinator reaches it on its own bus address
// (role worker, its id), through the worker's own connection.
//
// Every heartbeat reports the attempts the worker holds (protocol/held.go), so a
// connection that comes back costs nothing: the worker heartbeats, its attempts go on
// and their results count, an assignment lost meanwhile is queued again by the
// coordinator at once (without spending an attempt), and an attempt whose cancel was
// lost is cancelled again. The worker registers again only when the coordinator has
// forgotten it; the coordinator then keeps the leases of the attempts the worker
// reports, and the worker cancels the others (their results would be stale). A cancel
// only touches the attempt whose job and attempt id it names, never a newer attempt of
// the same job.
//
//	w, err := worker.Connect(ctx, "nats://127.0.0.1:4222", worker.WithCapacity(8))
//	...
//	defer w.Close()
//	err = w.Run(ctx) // until ctx ends
package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/workerproto"
	"github.com/jobbus/jobbus/worker/internal/attempts"
)

// ErrStarted is returned by a second call of Run: a Worker runs once.
var ErrStarted = errors.New("worker: already started")

// coordinator is where a worker sends its messages: the coordinator role, whose
// handlers run on the leader.
var coordinator = bus.Address{Role: bus.RoleCoordinator}

// Worker runs attempts for a coordinator. Create it with New or Connect, call Run once,
// then Close. Its methods are safe for concurrent use.
type Worker struct {
	cfg  config
	node *bus.Node
	log  *slog.Logger

	started atomic.Bool

	// draining is set by Drain; drainSent once the coordinator acknowledged it (reset
	// by every registration, which the coordinator sees as a fresh worker).
	draining, drainSent atomic.Bool
	// inflight counts attempts until their result is delivered, for Drain.
	inflight *inflight

	// attempts are the attempts executing now; each generation of it is a
	// registration, and Run's shutdown ends them with errShutdown.
	attempts *attempts.Set
	// held is what heartbeats and registrations report the worker holds.
	held *workerproto.Holdings
	// instance names this Worker in each of its registrations, so the coordinator
	// knows a registration again from the same process (protocol.WorkerRegister).
	instance string

	// sendCtx bounds result deliveries; it ends when the shutdown grace runs out.
	sendCtx  context.Context
	stopSend context.CancelFunc
	sending  sync.WaitGroup // the goroutines that deliver results in batches
	// results delivers the attempts' results, in batches where the coordinator takes
	// them (group commit).
	results *workerproto.Results

	closeOnce sync.Once
	closeErr  error

	// js publishes the attempts' logs (visibility.go), made on the first record.
	jsOnce sync.Once
	js     jetstream.JetStream
	jsErr  error
}

// New returns a worker whose bus node shares nc; Close leaves nc open.
func New(nc *nats.Conn, opts ...Option) (*Worker, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	node, err := bus.New(nc, bus.Address{Role: bus.RoleWorker, ID: cfg.ID}, cfg.nodeOptions()...)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	return newWorker(cfg, node), nil
}

// Connect returns a worker with a NATS connection of its own to url, which Close
// closes. It does not wait for the server: Run registers once it is reachable.
func Connect(ctx context.Context, url string, opts ...Option) (*Worker, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	node, err := bus.Connect(ctx, url, bus.Address{Role: bus.RoleWorker, ID: cfg.ID}, cfg.nodeOptions()...)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	return newWorker(cfg, node), nil
}

func (c *config) nodeOptions() []bus.Option {
	// Envelope2: asks without headers, which every coordinator reads (bus.EnvelopeVersion).
	return append([]bus.Option{bus.WithLogger(c.Logger), bus.WithEnvelope(bus.Envelope2)}, c.busOpts...)
}

func newWorker(cfg config, node *bus.Node) *Worker {
	log := cfg.Logger.With("worker", cfg.ID)
	w := &Worker{
		cfg:      cfg,
		node:     node,
		log:      log,
		attempts: attempts.New(cfg.Registry, cfg.Capacity, log),
		inflight: newInflight(),
		held:     workerproto.NewHoldings(),
		instance: newInstance(),
	}
	w.sendCtx, w.stopSend = context.WithCancel(context.Background())
	w.results = workerproto.NewResults(w.sendCtx, node, cfg.ID, cfg.retry(), resultAsks, &w.sending)
	return w
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// Running is the number of attempts executing now.
func (w *Worker) Running() int { return w.attempts.Len() }

// Run serves the coordinator until ctx ends: it registers (retrying until the
// coordinator answers; a registration larger than a NATS message holds ends Run with
// an error naming both sizes), heartbeats, registers again when the coordinator has
// forgotten it, and runs what it is assigned.
//
// When ctx ends, Run stops taking work (telling the coordinator, as Drain does),
// cancels the running attempts, keeps delivering the results of attempts that had
// finished, or finish, for up to the shutdown timeout (heartbeating meanwhile, so the
// coordinator keeps their leases), says goodbye and waits for the coordinator's answer
// (so a worker started again under the same id registers after it), and returns nil
// once every goroutine it started has ended.
// A task that ignores its context's end therefore holds Run up.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return ErrStarted
	}
	if err := w.handle(); err != nil {
		w.stopAccepting()
		return err
	}
	// A connection that came back may have missed assignments or cancels: a heartbeat
	// at once reports what the worker holds, and the coordinator settles them.
	nc := w.node.Conn()
	reconnected := nc.StatusChanged(nats.CONNECTED)
	err := w.serve(ctx, reconnected)
	nc.RemoveStatusListener(reconnected)
	return errors.Join(err, w.shutdown())
}

// handle serves the coordinator's tells on the worker's own address.
func (w *Worker) handle() error {
	if err := bus.Handle(w.node, protocol.PathAssign, w.onAssign); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := bus.Handle(w.node, protocol.PathAssigns, w.onAssigns); err != nil {
		return errors.Join(fmt.Errorf("worker: %w", err), w.node.Unhandle(protocol.PathAssign))
	}
	if err := bus.Handle(w.node, protocol.PathCancel, w.onCancel); err != nil {
		return errors.Join(fmt.Errorf("worker: %w", err), w.node.Unhandle(protocol.PathAssign), w.node.Unhandle(protocol.PathAssigns))
	}
	return nil
}

// shutdown ends Run: no new attempts (the coordinator is told), running ones
// cancelled, finished results delivered within the grace, then the goodbye.
func (w *Worker) shutdown() error {
	n := w.stopAccepting()
	// Told, as by Drain, the coordinator assigns the worker nothing more: it would
	// count every attempt assigned now, which the worker does not start, at the goodbye.
	w.draining.Store(true)
	if !w.drainSent.Load() {
		_, _ = w.sendDrain(context.Background())
	}
	err := errors.Join(w.node.Unhandle(protocol.PathAssign), w.node.Unhandle(protocol.PathAssigns), w.node.Unhandle(protocol.PathCancel))
	if n > 0 {
		w.log.Info("worker stopping: cancelled running attempts", "running", n)
	}
	// Heartbeats go on until the goodbye: a shutdown timeout may outlast the
	// coordinator's heartbeat timeout, and a worker lost meanwhile loses the attempts
	// whose results are still on their way.
	stopBeats := w.beatUntilStopped()
	w.drain()
	stopBeats()
	// The goodbye comes after the results, which it would otherwise make stale. It is
	// an ask, answered once the coordinator has let the worker go, within the node's
	// ask timeout: a tell left Run while it was on its way, and a restart under the same
	// id (--id) that registered first lost its new registration, and the attempts
	// assigned to it, when the goodbye landed after.
	if berr := workerproto.Disconnect(context.Background(), w.node, w.cfg.ID, "worker shutting down"); berr != nil && !errors.Is(berr, bus.ErrClosed) {
		w.log.Warn("worker could not say goodbye", "err", berr)
	}
	w.log.Info("worker stopped")
	return err
}

// beatUntilStopped heartbeats every heartbeat interval until the function it returns
// is called, which returns once the heartbeats have stopped, or until the shutdown
// timeout runs out: a task that holds Run up beyond it must not keep the worker, and
// its job, looking alive. They report nothing the worker holds: an attempt the
// shutdown cut short is held no more, yet it ran, and reconciled it would count as an
// assignment never delivered, queued again without spending its attempt; the goodbye
// settles it instead. A coordinator that has forgotten the worker is left so: the
// worker is going.
func (w *Worker) beatUntilStopped() (stop func()) {
	ctx, cancel := context.WithCancel(w.sendCtx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(w.cfg.Heartbeat)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			beat, cancelBeat := context.WithTimeout(ctx, w.cfg.Heartbeat)
			_, _, err := workerproto.Heartbeat(beat, w.node, &protocol.Heartbeat{WorkerID: w.cfg.ID})
			cancelBeat()
			if errors.Is(err, bus.ErrClosed) {
				return
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// stopAccepting refuses new attempts and cancels the running ones, returning how many.
func (w *Worker) stopAccepting() int { return w.attempts.Shutdown(errShutdown) }

// drain waits for the attempt goroutines; when the grace runs out it stops their result
// deliveries, after which they end at once.
func (w *Worker) drain() {
	done := make(chan struct{})
	go func() {
		w.attempts.Wait()
		close(done)
	}()
	grace := time.NewTimer(w.cfg.shutdownTimeout)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		w.log.Warn("worker shutdown timeout: undelivered results dropped", "timeout", w.cfg.shutdownTimeout)
		w.stopSend()
		<-done
	}
}

// Close releases the worker's bus node, and the connection Connect opened. Call it after
// Run returns; it is idempotent.
func (w *Worker) Close() error {
	w.closeOnce.Do(func() {
		w.stopAccepting()
		w.stopSend()
		w.sending.Wait()
		w.closeErr = w.node.Close()
	})
	return w.closeErr
}

// newInstance is a random name for a Worker: 16 hex digits.
func newInstance() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
