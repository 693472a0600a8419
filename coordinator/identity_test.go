package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/jobbustest/suite"
)

// TestWorkersSpeakOnlyForThemselves: the coordinator takes a worker's registration,
// heartbeat, drain, goodbye and results only from that worker (the sender the bus
// reads from the subject), and a result only for an attempt it granted to the worker
// that sends it. Everything else is refused with 403, naming both workers, and changes
// nothing: the worker it named goes on as if nothing had been said.
func TestWorkersSpeakOnlyForThemselves(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	w1 := s.ManualWorker("w1", 1)
	id := s.Submit("SHA256", text("x"))
	a := s.NextAssign(w1)

	node := func(role bus.Role, id string) *bus.Node {
		n, err := bus.New(s.NC, bus.Address{Role: role, ID: id}, bus.WithLogger(nil))
		must(t, err)
		t.Cleanup(func() { _ = n.Close() })
		return n
	}
	w2, coord := node(bus.RoleWorker, "w2"), node(bus.RoleCoordinator, "c-other")
	tests := []struct {
		name string
		from *bus.Node
		path string
		req  any
		want string
	}{
		{"RegisterAsAnother", w2, protocol.PathRegister, &protocol.WorkerRegister{WorkerID: "w1", Capacity: 4}, "worker/w2 may not speak for worker/w1"},
		{"HeartbeatAsAnother", w2, protocol.PathHeartbeat, &protocol.Heartbeat{WorkerID: "w1"}, "worker/w2 may not speak for worker/w1"},
		{"DrainAsAnother", w2, protocol.PathDrain, &protocol.Drain{WorkerID: "w1"}, "worker/w2 may not speak for worker/w1"},
		{"DisconnectAsAnother", w2, protocol.PathDisconnect, &protocol.Disconnect{WorkerID: "w1", Cause: "forged"}, "worker/w2 may not speak for worker/w1"},
		{"ResultAsAnother", w2, protocol.PathResult, suite.Result("w1", a, true, "forged"), "worker/w2 may not speak for worker/w1"},
		{"ResultForAnothersAttempt", w2, protocol.PathResult, suite.Result("w2", a, true, "forged"),
			"attempt " + a.AttemptID + " of job " + id + " was assigned to worker w1, not to worker w2"},
		{"NotAWorker", coord, protocol.PathRegister, &protocol.WorkerRegister{WorkerID: "w1", Capacity: 4}, "coordinator/c-other may not speak for worker/w1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := bus.Ask[json.RawMessage](ctx, tt.from, coordinatorAddr, tt.path, tt.req)
			if !errors.Is(err, bus.CodeForbidden) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want 403 saying %q", err, tt.want)
			}
		})
	}

	// w1 is still registered, not draining, and its attempt still counts.
	if j := s.Status(id); j.State != protocol.StateRunning {
		t.Fatalf("job after the impostors: %s, want RUNNING", j.State)
	}
	must(t, w1.Heartbeat())
	if ack := w1.Report(a, true, "genuine"); !ack.Accepted {
		t.Fatalf("w1's own result: %+v", ack)
	}
	if j := s.WaitState(id, protocol.StateCompleted); deref(j.Result) != "genuine" {
		t.Fatalf("result %q, want w1's", deref(j.Result))
	}
	next := s.Submit("SHA256", text("y"))
	if b := s.NextAssign(w1); b.JobID != next {
		t.Fatalf("w1 was assigned %s, want %s", b.JobID, next)
	}
}
