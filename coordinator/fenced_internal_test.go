package coordinator

import (
	"errors"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestFencedCoordinatorCallsNoResultStale: a fenced coordinator's memory is not the
// truth: the attempt it holds RUNNING is RUNNING for its successor too, which read the
// store, and may have been granted anew there. A result that reaches it before its
// handlers are withdrawn is answered with an error (503 on the bus: offer it again, to
// the leader), never "stale, not accepted", which its worker takes as final and drops:
// the job would run again, or FAIL on its last attempt, though the worker finished it.
func TestFencedCoordinatorCallsNoResultStale(t *testing.T) {
	s := startMem(t, nil)
	s.register("w", 1)
	id := s.accepted(sha("x"))
	a := s.assigned("w")
	s.settle()
	s.sched.fence(ErrFenced)
	ack, err := s.result("w", a, true, false, "done")
	if err == nil {
		t.Fatalf("a fenced coordinator answered the result of job %s finally: %+v", id, ack)
	}
	if !errors.Is(err, ErrNotServing) || ack.Accepted {
		t.Fatalf("a fenced coordinator answered the result of job %s %+v, %v; want not accepted, not serving", id, ack, err)
	}
	s.sched.mu.Lock()
	defer s.sched.mu.Unlock()
	if j := s.sched.jobs[id]; j == nil || j.rec.State != protocol.StateRunning {
		t.Fatalf("a fenced coordinator changed job %s", id)
	}
}
