// Package workerproto is the worker's half of the protocol on the bus, shared by the
// native worker (package worker) and the bridge's sessions for TCP workers: how a
// worker registers, beats, delivers a result and says goodbye, and which answers of
// the coordinator are final. Each caller keeps its own loop (a native worker registers
// until answered; a TCP session registers once and lets its peer dial again); the
// decisions are made here, once.
package workerproto

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/backoff"
)

// Coordinator addresses any coordinator; NATS balances asks over them and the leader
// answers.
var Coordinator = bus.Address{Role: bus.RoleCoordinator}

// Final reports whether err, the outcome of an ask to the coordinator, ends the
// matter: an answer, a refusal of the request itself (bus.CodeBadRequest) or of the
// sender (bus.CodeForbidden: it spoke for another worker, or reported another's
// attempt), or a closed node. Anything else (no coordinator, no answer, a coordinator
// that cannot serve now) is worth asking again.
func Final(err error) bool {
	return err == nil || errors.Is(err, bus.CodeBadRequest) || errors.Is(err, bus.CodeForbidden) ||
		errors.Is(err, bus.ErrClosed)
}

// Register asks the coordinator once to register the worker.
func Register(ctx context.Context, node *bus.Node, reg *protocol.WorkerRegister) (*protocol.WorkerRegistered, error) {
	ans, err := bus.Ask[protocol.WorkerRegistered](ctx, node, Coordinator, protocol.PathRegister, reg)
	if err != nil {
		return nil, err
	}
	return &ans, nil
}

// Beat is what a heartbeat found out.
type Beat int

const (
	// Alive: the coordinator knows the worker.
	Alive Beat = iota
	// Forgotten: the coordinator does not know the worker (it restarted, or lost the
	// worker), which must register again.
	Forgotten
	// Unanswered: nobody answered, or the coordinator could not serve; the next beat
	// will tell.
	Unanswered
)

// Heartbeat asks the coordinator to refresh the worker, reporting what it holds if
// hb.Held is set (protocol/held.go). With Alive, mark is where the coordinator's
// assignments to the worker stand (nil from a coordinator that does not reconcile).
// err is set only with Unanswered, saying why.
func Heartbeat(ctx context.Context, node *bus.Node, hb *protocol.Heartbeat) (beat Beat, mark *protocol.Mark, err error) {
	ack, err := bus.Ask[protocol.HeartbeatAck](ctx, node, Coordinator, protocol.PathHeartbeat, hb)
	switch {
	case err == nil:
		return Alive, ack.Mark, nil
	case errors.Is(err, bus.CodeNotFound):
		return Forgotten, nil, err
	}
	return Unanswered, nil, err
}

// Deliver offers a result, res as protocol.Encode writes a TASK_RESULT, to the
// coordinator until it answers finally (the answer comes once the outcome is durable,
// so a result outlives a coordinator restart or failover), ctx ends, the node closes,
// or (unless zero) the time is past until. Each offer waits at most the node's ask
// timeout; between offers it waits per retry. Results delivers a result alone here (to
// a coordinator without batches, or one too large for a batch). It makes no context of
// its own.
func Deliver(ctx context.Context, node *bus.Node, res json.RawMessage, until time.Time, retry backoff.Policy) (ack protocol.ResultAck, tries int, err error) {
	b := retry.Start()
	for tries = 1; ; tries++ {
		ack, err = bus.Ask[protocol.ResultAck](ctx, node, Coordinator, protocol.PathResult, res)
		if Final(err) {
			return ack, tries, err
		}
		delay := b.Next()
		if !until.IsZero() && time.Now().Add(delay).After(until) {
			return ack, tries, err
		}
		if !backoff.Sleep(ctx, delay) {
			return ack, tries, err
		}
	}
}

// Drain asks the coordinator once to assign the worker nothing more, and returns how
// many attempts it still counts as running there. An error with bus.CodeNotFound means
// the coordinator does not know the worker.
func Drain(ctx context.Context, node *bus.Node, workerID string) (running int, err error) {
	ack, err := bus.Ask[protocol.DrainAck](ctx, node, Coordinator, protocol.PathDrain, &protocol.Drain{WorkerID: workerID})
	return ack.Running, err
}

// Disconnect reports the worker lost, so the coordinator need not wait for the
// heartbeat timeout. It asks rather than tells, so that the loss is handled before a
// new registration of the same worker id.
func Disconnect(ctx context.Context, node *bus.Node, workerID, cause string) error {
	_, err := bus.Ask[json.RawMessage](ctx, node, Coordinator, protocol.PathDisconnect,
		&protocol.Disconnect{WorkerID: workerID, Cause: cause})
	return err
}
