package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/natsurl"
	"github.com/jobbus/jobbus/internal/workerproto"
	"github.com/jobbus/jobbus/worker/internal/attempts"
)

// serve registers, then heartbeats until ctx ends, registering again whenever the
// coordinator has forgotten the worker. A connection that came back heartbeats at
// once: the worker's report (protocol/held.go) settles the tells that may have been
// lost meanwhile, and its attempts go on. Only a closed node is an error.
func (w *Worker) serve(ctx context.Context, reconnected <-chan nats.Status) error {
	if err := w.register(ctx, "start"); err != nil {
		return err
	}
	tick := time.NewTicker(w.cfg.Heartbeat)
	defer tick.Stop()
	// A new leader's announcement makes the next heartbeat now: the new leader does not
	// know the worker yet, and says so.
	leader := make(chan *nats.Msg, 1)
	if sub, err := w.node.Conn().ChanSubscribe(protocol.LeaderSubject, leader); err == nil {
		defer func() { _ = sub.Unsubscribe() }()
	}
	for {
		var (
			reason string
			err    error
		)
		select {
		case <-ctx.Done():
			return nil
		case <-reconnected:
			tick.Reset(w.cfg.Heartbeat)
			if reason, err = w.beat(ctx); err != nil {
				return err
			}
		case <-leader:
			tick.Reset(w.cfg.Heartbeat)
			if reason, err = w.beat(ctx); err != nil {
				return err
			}
		case <-tick.C:
			if reason, err = w.beat(ctx); err != nil {
				return err
			}
		}
		if reason == "" {
			continue
		}
		if err = w.register(ctx, reason); err != nil {
			return err
		}
	}
}

// beat heartbeats, and says why the worker must register again, if it must.
func (w *Worker) beat(ctx context.Context) (reason string, err error) {
	forgotten, err := w.heartbeat(ctx)
	switch {
	case err != nil:
		return "", err
	case forgotten:
		return "coordinator does not know the worker", nil
	}
	if !w.drainSent.Load() {
		_, _ = w.sendDrain(ctx) // the coordinator has not heard it yet
	}
	return "", nil
}

// waitingGrace is how long registration may go unanswered before the worker says it
// is waiting: a worker started beside its coordinator (serve, a compose file) is
// usually answered well within it, and should not look like trouble.
const waitingGrace = time.Second

// register asks the coordinator to register the worker until it answers, reporting
// what the worker holds. Attempts assigned under an earlier registration that the
// coordinator did not keep are cancelled: the new registration ended their leases. It
// returns nil early when ctx ends.
func (w *Worker) register(ctx context.Context, reason string) error {
	b := w.cfg.retry().Start()
	start, said := time.Now(), false
	for try := 1; ; try++ {
		session := w.attempts.NextGeneration() // attempts assigned from now on belong to it
		msg := &protocol.WorkerRegister{WorkerID: w.cfg.ID, Capacity: w.cfg.Capacity,
			TaskTypes: w.cfg.Registry.Declarations(), Held: w.held.Report(), Instance: w.instance,
			Queues: w.cfg.Queues, StrictQueues: w.cfg.StrictQueues,
			Assigns: protocol.MaxAssigns} // onAssigns takes them on PathAssigns
		ans, err := workerproto.Register(ctx, w.node, msg)
		switch {
		case err == nil:
			// The new registration's mark starts its numbering; one from a coordinator
			// that does not reconcile is none.
			w.held.Reset()
			w.held.Marked(ans.Mark)
			w.results.Serves(ans.Results) // 0 from a coordinator without batches: one by one
			kept := w.attempts.Keep(session, leases(ans.Kept))
			n := w.attempts.CancelBefore(session, errAbandoned)
			w.log.Info("registered with the coordinator", "capacity", w.cfg.Capacity, "reason", reason, "kept", kept, "abandoned", n)
			// The coordinator sees a fresh worker: a drain must be said again.
			w.drainSent.Store(false)
			_, _ = w.sendDrain(ctx)
			return nil
		case ctx.Err() != nil:
			return nil
		case workerproto.Final(err):
			return fmt.Errorf("worker: register: %w", err)
		case errors.Is(err, nats.ErrMaxPayload):
			// NATS refused to send it, and always will: retrying would wait for ever.
			return w.tooLarge(msg, err)
		case errors.Is(err, bus.ErrRemote):
			w.log.Warn("worker registration refused; retrying", "err", err)
		case !said && time.Since(start) >= waitingGrace && errors.Is(err, bus.ErrDisconnected):
			// Not the coordinator's silence: the worker has no connection to NATS at all.
			w.log.Warn("NATS unreachable; waiting for it", "nats", w.natsServers(), "err", err)
			said = true
		case !said && time.Since(start) >= waitingGrace:
			w.log.Info("waiting for the coordinator", "err", err)
			said = true
		default:
			w.log.Debug("worker registration not answered; retrying", "err", err, "try", try)
		}
		if !b.Wait(ctx) {
			return nil
		}
	}
}

// tooLarge is the error of a registration the NATS connection refused to send, since
// with its envelope it exceeds the server's maximum payload: it names both, so that
// whoever declared the task types (their schemas, most often) knows by how much to
// shrink them.
func (w *Worker) tooLarge(msg *protocol.WorkerRegister, err error) error {
	data, _ := json.Marshal(msg) // the bus encoded it already, before NATS refused it
	return fmt.Errorf("worker: register: the registration (%d bytes, %d task types) does not fit in a NATS message, "+
		"whose maximum payload on this server is %d bytes: %w", len(data), len(msg.TaskTypes), w.node.Conn().MaxPayload(), err)
}

// natsServers are the NATS URLs the worker's connection tries, redacted.
func (w *Worker) natsServers() string {
	if u := natsurl.Connected(w.node.Conn()); u != "" {
		return u
	}
	return strings.Join(w.node.Conn().Servers(), ",")
}

// heartbeat tells the coordinator the worker is alive. forgotten reports an error
// answer: the coordinator does not know the worker, which must register again. A lost
// heartbeat only waits for the next one.
func (w *Worker) heartbeat(ctx context.Context) (forgotten bool, err error) {
	// A beat not answered before the next is due is superseded by the next.
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Heartbeat)
	defer cancel()
	beat, mark, err := workerproto.Heartbeat(ctx, w.node, &protocol.Heartbeat{WorkerID: w.cfg.ID, Held: w.held.Report()})
	switch {
	case beat == workerproto.Alive:
		w.held.Marked(mark)
		return false, nil
	case beat == workerproto.Forgotten:
		w.log.Info("heartbeat refused; registering again", "err", err)
		return true, nil
	case errors.Is(err, bus.ErrClosed):
		return false, fmt.Errorf("worker: heartbeat: %w", err)
	default:
		w.log.Debug("heartbeat not answered", "err", err)
		return false, nil
	}
}

// leases are the attempts.Lease of refs.
func leases(refs []protocol.AttemptRef) []attempts.Lease {
	out := make([]attempts.Lease, len(refs))
	for i, r := range refs {
		out[i] = attempts.Lease{JobID: r.JobID, AttemptID: r.AttemptID}
	}
	return out
}
