package coordinator_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// tells counts the tells to worker id on each path, by a subscription of the test's
// own to the worker's subjects.
type tells struct {
	single, batches atomic.Int64
}

func countTells(t *testing.T, nc *nats.Conn, id string) *tells {
	t.Helper()
	var n tells
	sub, err := nc.Subscribe("jobbus.node.worker."+id+".>", func(m *nats.Msg) {
		switch {
		case strings.HasSuffix(m.Subject, "."+protocol.PathAssign):
			n.single.Add(1)
		case strings.HasSuffix(m.Subject, "."+protocol.PathAssigns):
			n.batches.Add(1)
		}
	})
	must(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	must(t, nc.Flush())
	return &n
}

// ready counts the jobs queued ready to run.
func ready(s *system) int {
	n := 0
	for _, q := range s.Coordinator.Stats().Queues {
		n += q.Queued
	}
	return n
}

// takeBatches makes w a worker that takes batches of assignments: each assignment of a
// TaskAssigns goes to w.assigns, in the batch's order, and the batch's size to sizes.
func (w *rawWorker) takeBatches(sizes chan<- int) {
	w.t.Helper()
	must(w.t, bus.Handle(w.node, protocol.PathAssigns, func(_ context.Context, _ bus.Address, b protocol.TaskAssigns) (struct{}, error) {
		sizes <- len(b.Assigns)
		for _, a := range b.Assigns {
			w.assigns <- a
		}
		return struct{}{}, nil
	}))
}

// registerAs registers a raw worker with capacity slots, saying it takes batches of
// up to assigns assignments (0: it does not say so, as an older worker).
func (w *rawWorker) registerAs(capacity, assigns int) protocol.WorkerRegistered {
	w.t.Helper()
	ans, err := bus.Ask[protocol.WorkerRegistered](context.Background(), w.node, coordinatorAddr, protocol.PathRegister,
		&protocol.WorkerRegister{WorkerID: w.id, Capacity: capacity, Instance: "p1", Assigns: assigns})
	must(w.t, err)
	return ans
}

// TestNativeWorkerGetsAssignmentsInBatches: a native worker with many slots, and many
// jobs queued for it, receives their assignments in fewer tells than assignments, all
// on the batch path, and every job completes on its first attempt with its own result.
func TestNativeWorkerGetsAssignmentsInBatches(t *testing.T) {
	t.Parallel()
	s := setup(t)
	const jobs = 48
	ids := make([]string, jobs)
	for i := range ids { // queued before any worker: its registration assigns them at once
		ids[i] = s.Submit("SHA256", text(fmt.Sprint(i)))
	}
	s.Eventually("every job ready", func() bool { return ready(s) == jobs })
	n := countTells(t, s.NC, "*") // the only worker's
	s.StartWorker(jobs)
	for i, id := range ids {
		if j := s.Wait(id); j.State != protocol.StateCompleted || deref(j.Result) != sha256Hex(fmt.Sprint(i)) || j.Attempts != 1 {
			t.Fatalf("job %d %+v result %q, want COMPLETED on its first attempt", i, j, deref(j.Result))
		}
	}
	if b, one := n.batches.Load(), n.single.Load(); b == 0 || b >= jobs || one != 0 {
		t.Fatalf("%d assignments went in %d batch tells and %d single ones, want fewer batch tells than assignments and no single ones", jobs, b, one)
	}
	t.Logf("%d assignments in %d tells", jobs, n.batches.Load())
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestOlderNativeWorkerGetsSingleAssignments: a native worker that does not say it
// takes batches (an older one) receives each assignment alone, a TASK_ASSIGN on
// task.assign, even when many go to it at once.
func TestOlderNativeWorkerGetsSingleAssignments(t *testing.T) {
	t.Parallel()
	s := reconcileSystem(t)
	const jobs = 8
	ids := make(map[string]bool, jobs)
	for i := range jobs {
		ids[s.Submit("SHA256", text(fmt.Sprint(i)))] = true
	}
	n := countTells(t, s.NC, "older")
	w := newRawWorker(t, s, "older")
	sizes := make(chan int, jobs)
	w.takeBatches(sizes) // it could, but did not say so
	w.registerAs(jobs, 0)
	for range jobs {
		a := w.nextAssign()
		if !ids[a.JobID] {
			t.Fatalf("assignment %+v of an unknown or repeated job", a)
		}
		delete(ids, a.JobID)
		if ack := w.report(a, "done"); !ack.Accepted {
			t.Fatalf("result of %+v not accepted", a)
		}
	}
	if b, one := n.batches.Load(), n.single.Load(); b != 0 || one != jobs || len(sizes) != 0 {
		t.Fatalf("%d batch tells and %d single ones, want %d single ones only", b, one, jobs)
	}
}

// TestLostAssignmentInBatchQueuedAgain: a batch of assignments of which the worker
// keeps one and loses the others (dropped on the way, as in an outage): its reports
// find the lost ones, each counted as if sent alone, and their jobs run again under
// new leases without spending an attempt, while the kept one keeps its lease. Every
// job completes on its first counted attempt.
func TestLostAssignmentInBatchQueuedAgain(t *testing.T) {
	t.Parallel()
	s := reconcileSystem(t)
	const jobs = 3
	ids := make([]string, jobs)
	for i := range ids {
		ids[i] = s.Submit("SHA256", text(fmt.Sprint(i)), client.MaxAttempts(1))
	}
	s.Eventually("every job ready", func() bool { return ready(s) == jobs })
	w := newRawWorker(t, s, "batch-dropper")
	sizes := make(chan int, 16)
	w.takeBatches(sizes)
	reg := w.registerAs(jobs, protocol.MaxAssigns) // assigns them all, then answers its mark
	if reg.Mark == nil || reg.Mark.Seq != jobs {
		t.Fatalf("registration mark %+v, want one that counts the %d assignments it made", reg.Mark, jobs)
	}
	first := make([]protocol.TaskAssign, jobs)
	for i := range first {
		first[i] = w.nextAssign()
	}
	select {
	case got := <-sizes:
		if got != jobs {
			t.Fatalf("the first batch carried %d assignments, want all %d", got, jobs)
		}
	default: // each has been handed on by the batch's handler
		t.Fatal("the assignments came alone, not in a batch")
	}
	kept, lost := first[1], []protocol.TaskAssign{first[0], first[2]} // the others dropped: never run

	// A report under the registration's mark, which counts the whole batch, holding
	// only the kept one.
	w.heartbeat(&protocol.Held{Mark: *reg.Mark, Attempts: holding(ref(kept))})
	again := map[string]protocol.TaskAssign{}
	for range lost {
		a := w.nextAssign()
		again[a.JobID] = a
	}
	for _, d := range lost {
		a, ok := again[d.JobID]
		if !ok || a.AttemptID == d.AttemptID || a.AttemptNumber != 1 {
			t.Fatalf("lost %+v assigned again as %+v (%v): want a new lease, still attempt 1", d, a, ok)
		}
		if ack := w.report(d, "stale"); ack.Accepted {
			t.Errorf("a result under the lost lease %+v was accepted", d)
		}
		if ack := w.report(a, "done"); !ack.Accepted {
			t.Fatalf("the result of the new lease %+v was not accepted", a)
		}
	}
	if j := s.Status(kept.JobID); j.State != protocol.StateRunning || j.Attempts != 1 {
		t.Fatalf("the kept assignment's job %+v, want RUNNING on its first attempt", j)
	}
	if ack := w.report(kept, "done"); !ack.Accepted {
		t.Fatal("the kept lease's result was not accepted")
	}
	for _, id := range ids {
		if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 || deref(j.Result) != "done" {
			t.Fatalf("job %+v result %q error %q: want COMPLETED on its one attempt", j, deref(j.Result), deref(j.Error))
		}
	}
	select {
	case a := <-w.assigns:
		t.Fatalf("an assignment more: %+v", a)
	default:
	}
}

// TestLargeAssignmentsSplitIntoBatches: assignments whose payloads would not fit in one
// NATS message together go in several batches, in order, and none is lost: the
// worker is not lost for a batch too large to send, and every job completes on its
// first attempt.
func TestLargeAssignmentsSplitIntoBatches(t *testing.T) {
	t.Parallel()
	s := reconcileSystem(t) // no worker lost for a slow heartbeat under -race: only a failed send loses it
	const jobs = 12         // 12 x 100,000 characters: more than NATS's 1 MiB in one message
	ids := make([]string, jobs)
	texts := make([]string, jobs)
	for i := range ids {
		texts[i] = strings.Repeat(string(rune('a'+i)), 100_000)
		ids[i] = s.Submit("SHA256", text(texts[i]))
	}
	s.Eventually("every job ready", func() bool { return ready(s) == jobs })
	n := countTells(t, s.NC, "*")
	s.StartWorker(jobs)
	for i, id := range ids {
		if j := s.Wait(id); j.State != protocol.StateCompleted || deref(j.Result) != sha256Hex(texts[i]) || j.Attempts != 1 {
			t.Fatalf("job %d %+v error %q, want COMPLETED on its first attempt", i, j, deref(j.Error))
		}
	}
	if b, one := n.batches.Load(), n.single.Load(); b < 2 || b >= jobs || one != 0 {
		t.Fatalf("%d large assignments went in %d batch tells and %d single ones, want several batches, fewer than assignments", jobs, b, one)
	}
}
