package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/backoff"
	"github.com/jobbus/jobbus/internal/jobbustest/suite"
	"github.com/jobbus/jobbus/internal/workerproto"
)

// rawWorker is a worker made of a NATS connection of its own and a bus node, whose
// every message the test writes: it can drop an assignment, report what it likes, and
// register again.
type rawWorker struct {
	t       testing.TB
	id      string
	node    *bus.Node
	assigns chan protocol.TaskAssign
	cancels chan protocol.TaskCancel
}

func newRawWorker(t testing.TB, s *system, id string) *rawWorker {
	t.Helper()
	nc, err := s.Server.Connect()
	must(t, err)
	t.Cleanup(nc.Close)
	node, err := bus.New(nc, bus.Address{Role: bus.RoleWorker, ID: id}, bus.WithLogger(nil))
	must(t, err)
	t.Cleanup(func() { _ = node.Close() })
	w := &rawWorker{t: t, id: id, node: node, assigns: make(chan protocol.TaskAssign, 16), cancels: make(chan protocol.TaskCancel, 16)}
	must(t, bus.Handle(node, protocol.PathAssign, func(_ context.Context, _ bus.Address, a protocol.TaskAssign) (struct{}, error) {
		w.assigns <- a
		return struct{}{}, nil
	}))
	must(t, bus.Handle(node, protocol.PathCancel, func(_ context.Context, _ bus.Address, c protocol.TaskCancel) (struct{}, error) {
		w.cancels <- c
		return struct{}{}, nil
	}))
	return w
}

func (w *rawWorker) register(instance string, held *protocol.Held) protocol.WorkerRegistered {
	w.t.Helper()
	ans, err := bus.Ask[protocol.WorkerRegistered](context.Background(), w.node, coordinatorAddr, protocol.PathRegister,
		&protocol.WorkerRegister{WorkerID: w.id, Capacity: 1, Held: held, Instance: instance})
	must(w.t, err)
	if ans.Mark == nil {
		w.t.Fatal("registration answered without a mark")
	}
	return ans
}

func (w *rawWorker) heartbeat(held *protocol.Held) protocol.Mark {
	w.t.Helper()
	ack, err := bus.Ask[protocol.HeartbeatAck](context.Background(), w.node, coordinatorAddr, protocol.PathHeartbeat,
		&protocol.Heartbeat{WorkerID: w.id, Held: held})
	must(w.t, err)
	if ack.Mark == nil {
		w.t.Fatal("heartbeat answered without a mark")
	}
	return *ack.Mark
}

func (w *rawWorker) nextAssign() protocol.TaskAssign {
	w.t.Helper()
	select {
	case a := <-w.assigns:
		return a
	case <-time.After(10 * time.Second):
		w.t.Fatal("no assignment within 10s")
		return protocol.TaskAssign{}
	}
}

// report delivers a result as a worker does: offered until it is answered finally (a
// result whose attempt ended in memory only is answered 503 until that is stored).
func (w *rawWorker) report(a protocol.TaskAssign, result string) protocol.ResultAck {
	w.t.Helper()
	data, err := protocol.Encode(suite.Result(w.id, a, true, result))
	must(w.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, _, err := workerproto.Deliver(ctx, w.node, data, time.Time{}, backoff.Policy{Base: time.Millisecond, Max: 50 * time.Millisecond})
	must(w.t, err)
	return ack
}

func ref(a protocol.TaskAssign) protocol.AttemptRef {
	return protocol.AttemptRef{JobID: a.JobID, AttemptID: a.AttemptID}
}

// holding lists attempts held and running.
func holding(refs ...protocol.AttemptRef) []protocol.HeldAttempt {
	out := make([]protocol.HeldAttempt, len(refs))
	for i, r := range refs {
		out[i] = protocol.HeldAttempt{AttemptRef: r}
	}
	return out
}

// reconcileSystem is a system whose workers are lost only when the test says so, and
// whose execution deadline is far: anything that moves a job here is reconciliation.
func reconcileSystem(t *testing.T) *system {
	return setup(t, func(c *coordinator.Config) {
		c.HeartbeatTimeout = time.Hour
		c.TaskTimeout = time.Hour
	})
}

// TestLostAssignmentQueuedAgain is a TASK_ASSIGN lost on its way (a worker that drops
// it stands in for an outage): the worker's heartbeats find it long before its
// execution deadline (an hour), the job runs again without spending an attempt, and
// it completes on its first counted attempt. An assignment after the mark a report
// carries is left alone: it may still be on its way.
func TestLostAssignmentQueuedAgain(t *testing.T) {
	t.Parallel()
	s := reconcileSystem(t)
	w := newRawWorker(t, s, "dropper")
	reg := w.register("", nil)
	id := s.Submit("SHA256", text("x"), client.MaxAttempts(1))
	dropped := w.nextAssign() // and dropped: never run

	// The first report's mark is the registration's, from before the assignment: it
	// judges nothing, and the job stays RUNNING under its lease.
	mark := w.heartbeat(&protocol.Held{Mark: *reg.Mark, Attempts: holding()})
	if j := s.Status(id); j.State != protocol.StateRunning || j.Attempts != 1 {
		t.Fatalf("after a report that cannot judge the assignment: job %+v", j)
	}
	if mark.Seq <= reg.Mark.Seq {
		t.Fatalf("heartbeat mark %+v does not count the assignment (registration %+v)", mark, *reg.Mark)
	}
	// The next report carries the mark that counts it, and holds nothing.
	w.heartbeat(&protocol.Held{Mark: mark, Attempts: holding()})
	again := w.nextAssign()
	if again.AttemptID == dropped.AttemptID || again.AttemptNumber != 1 {
		t.Fatalf("assigned again as %+v after %+v: want a new lease, still attempt 1", again, dropped)
	}
	if ack := w.report(dropped, "stale"); ack.Accepted {
		t.Error("a result under the dropped lease was accepted")
	}
	if ack := w.report(again, "done"); !ack.Accepted {
		t.Fatal("the result of the new lease was not accepted")
	}
	j := s.Wait(id)
	if j.State != protocol.StateCompleted || j.Attempts != 1 || deref(j.Result) != "done" || j.Error != nil {
		t.Fatalf("job %+v result %q error %q: want COMPLETED on its one attempt", j, deref(j.Result), deref(j.Error))
	}
}

// TestReconcile is the coordinator's side of reconciliation, case by case: a worker
// (process "p1") registered and assigned one job, then reporting (by heartbeat, or by
// registering again as some process) what it holds under some mark. want is where the
// job's lease ends up.
func TestReconcile(t *testing.T) {
	type outcome int
	const (
		kept     outcome = iota // the same lease goes on; its result counts
		requeued                // a new lease, attempt not counted
		spent                   // lost with the worker: attempt counted
	)
	holdingIt := func(a protocol.TaskAssign, m protocol.Mark) *protocol.Held {
		return &protocol.Held{Mark: m, Attempts: holding(ref(a))}
	}
	missingIt := func(_ protocol.TaskAssign, m protocol.Mark) *protocol.Held { return &protocol.Held{Mark: m} }
	cases := []struct {
		name     string
		register string // register again as this process ("-": report by heartbeat)
		held     func(a protocol.TaskAssign, m protocol.Mark) *protocol.Held
		want     outcome
	}{
		{"HeartbeatHolding", "-", holdingIt, kept},
		{"HeartbeatMissingUnderMark", "-", missingIt, requeued},
		{"HeartbeatMissingBeforeMark", "-", func(_ protocol.TaskAssign, m protocol.Mark) *protocol.Held {
			m.Seq-- // the assignment may still be on its way
			return &protocol.Held{Mark: m}
		}, kept},
		{"HeartbeatMissingOtherSession", "-", func(_ protocol.TaskAssign, m protocol.Mark) *protocol.Held {
			return &protocol.Held{Mark: protocol.Mark{Session: "another", Seq: m.Seq + 100}}
		}, kept},
		{"HeartbeatWithoutReport", "-", func(protocol.TaskAssign, protocol.Mark) *protocol.Held { return nil }, kept},
		{"RegisterHolding", "p1", holdingIt, kept},
		{"RegisterHoldingAsAnotherProcess", "p2", func(a protocol.TaskAssign, _ protocol.Mark) *protocol.Held {
			// A process that knows the attempt id holds the attempt, whatever its mark.
			return &protocol.Held{Attempts: holding(ref(a))}
		}, kept},
		{"RegisterMissingSameProcess", "p1", func(protocol.TaskAssign, protocol.Mark) *protocol.Held {
			return &protocol.Held{} // the answer to its registration was lost: it knows no mark
		}, requeued},
		{"RegisterMissingAnotherProcess", "p2", missingIt, spent},
		{"RegisterMissingNoProcessName", "", missingIt, spent},
		{"RegisterWithoutReport", "p1", func(protocol.TaskAssign, protocol.Mark) *protocol.Held { return nil }, spent},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := reconcileSystem(t)
			w := newRawWorker(t, s, "w1")
			w.register("p1", nil)
			id := s.Submit("SHA256", text("x"), client.MaxAttempts(2))
			a := w.nextAssign()
			mark := w.heartbeat(&protocol.Held{Attempts: holding(ref(a))}) // counts a
			held := tc.held(a, mark)
			if tc.register == "-" {
				w.heartbeat(held)
			} else {
				ans := w.register(tc.register, held)
				holds := held != nil && len(held.Attempts) == 1
				if got := len(ans.Kept) == 1 && ans.Kept[0] == ref(a); got != (tc.want == kept && holds) {
					t.Errorf("registration answered kept %+v", ans.Kept)
				}
				// Under the new registration, the worker reports what it holds.
				after := &protocol.Held{Mark: *ans.Mark, Attempts: holding()}
				if holds {
					after.Attempts = held.Attempts
				}
				w.heartbeat(after)
			}
			switch tc.want {
			case kept:
				if ack := w.report(a, "done"); !ack.Accepted {
					t.Fatal("the kept lease's result was not accepted")
				}
				if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 {
					t.Fatalf("job %+v, want COMPLETED on attempt 1", j)
				}
			case requeued:
				again := w.nextAssign()
				if again.AttemptID == a.AttemptID || again.AttemptNumber != 1 {
					t.Fatalf("assigned again as %+v after %+v: want a new lease, attempt 1 again", again, a)
				}
				if j := s.Status(id); j.Attempts != 1 || j.Error != nil {
					t.Fatalf("job %+v error %q: an undelivered assignment counts no attempt and is no error", j, deref(j.Error))
				}
			case spent:
				again := w.nextAssign() // after the retry delay
				if again.AttemptNumber != 2 {
					t.Fatalf("assigned again as %+v, want attempt 2", again)
				}
				if j := s.Status(id); deref(j.Error) != "worker w1 lost (worker re-registered)" {
					t.Fatalf("job %+v error %q", j, deref(j.Error))
				}
			}
		})
	}
}

// TestUnleasedAttemptCancelled: an attempt the worker runs under no lease here (its
// TASK_CANCEL was lost, say) is cancelled again; the lease the worker holds is not, nor
// is an attempt it reports done (its result on its way, settled here already).
func TestUnleasedAttemptCancelled(t *testing.T) {
	t.Parallel()
	s := reconcileSystem(t)
	w := newRawWorker(t, s, "w1")
	reg := w.register("", nil)
	s.Submit("SHA256", text("x"))
	a := w.nextAssign()
	revoked := protocol.AttemptRef{JobID: "job-cancelled-meanwhile", AttemptID: "attempt-revoked"}
	finished := protocol.HeldAttempt{AttemptRef: protocol.AttemptRef{JobID: "job-finished", AttemptID: "attempt-done"}, Done: true}
	w.heartbeat(&protocol.Held{Mark: *reg.Mark, Attempts: append(holding(ref(a), revoked), finished)})
	select {
	case c := <-w.cancels:
		if c.JobID != revoked.JobID || c.AttemptID != revoked.AttemptID {
			t.Fatalf("cancelled %+v, want %+v only", c, revoked)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no TASK_CANCEL for the attempt under no lease")
	}
	if ack := w.report(a, "done"); !ack.Accepted {
		t.Fatal("the leased attempt's result was not accepted")
	}
	select {
	case c := <-w.cancels:
		t.Fatalf("unexpected cancel %+v", c)
	default:
	}
}

// TestLostAssignmentGivesItsTokenBack: an assignment that never reached its worker
// started nothing, so it gives back the rate limit's token it took: under a limit of
// one start an hour, the job queued again starts at once rather than an hour later.
func TestLostAssignmentGivesItsTokenBack(t *testing.T) {
	t.Parallel()
	s := reconcileSystem(t)
	_, err := s.Client.SetLimit(context.Background(), client.ForTaskType("SHA256"), "1/h", 1)
	must(t, err)
	w := newRawWorker(t, s, "dropper")
	reg := w.register("", nil)
	id := s.Submit("SHA256", text("x"))
	dropped := w.nextAssign() // and dropped: never run
	mark := w.heartbeat(&protocol.Held{Mark: *reg.Mark, Attempts: holding()})
	w.heartbeat(&protocol.Held{Mark: mark, Attempts: holding()}) // judges it: never delivered
	again := w.nextAssign()
	if again.JobID != id || again.AttemptID == dropped.AttemptID {
		t.Fatalf("assigned again %+v after %+v, want the job on a new lease", again, dropped)
	}
}
