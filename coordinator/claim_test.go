package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/worker"
)

// TestClaimAfterRestart is the coordinator's side of claims (recover.go): worker w1 runs
// a job's only attempt, the coordinator restarts, and w1 (or another worker, or nobody)
// says something about the attempt. Until it is claimed or lost, the job stays RUNNING
// under its attempt and is assigned to nobody else: a second worker with a free slot
// is given a later job first.
func TestClaimAfterRestart(t *testing.T) {
	type outcome int
	const (
		goesOn    outcome = iota // the attempt goes on; its result counts
		lost                     // counted and lost: the job fails (its final attempt)
		cancelled                // the client's cancel ended it
	)
	holdingIt := func(a protocol.TaskAssign) *protocol.Held { return &protocol.Held{Attempts: holding(ref(a))} }
	cases := []struct {
		name  string
		grace time.Duration // the claim grace; an hour unless set
		// then is what happens after the restart; it returns the registration's answer
		// to w1, if it registered.
		then func(t *testing.T, s *system, w1, w2 *rawWorker, a protocol.TaskAssign) *protocol.WorkerRegistered
		want outcome
	}{
		{"RegisterHolding", 0, func(_ *testing.T, _ *system, w1, _ *rawWorker, a protocol.TaskAssign) *protocol.WorkerRegistered {
			ans := w1.register("p1", holdingIt(a))
			return &ans
		}, goesOn},
		{"RegisterHoldingAsAnotherProcess", 0, func(_ *testing.T, _ *system, w1, _ *rawWorker, a protocol.TaskAssign) *protocol.WorkerRegistered {
			ans := w1.register("p2", holdingIt(a)) // the attempt id is what counts
			return &ans
		}, goesOn},
		{"RegisterDoneThenResult", 0, func(_ *testing.T, _ *system, w1, _ *rawWorker, a protocol.TaskAssign) *protocol.WorkerRegistered {
			held := &protocol.Held{Attempts: []protocol.HeldAttempt{{AttemptRef: ref(a), Done: true}}}
			ans := w1.register("p1", held)
			return &ans
		}, goesOn},
		{"ResultBeforeRegistering", 0, func(*testing.T, *system, *rawWorker, *rawWorker, protocol.TaskAssign) *protocol.WorkerRegistered {
			return nil
		}, goesOn},
		{"HeartbeatHolding", 0, func(_ *testing.T, _ *system, w1, _ *rawWorker, a protocol.TaskAssign) *protocol.WorkerRegistered {
			ans := w1.register("p1", nil) // reports nothing: decides nothing
			w1.heartbeat(&protocol.Held{Mark: *ans.Mark, Attempts: holding(ref(a))})
			return nil
		}, goesOn},
		{"AnotherWorkerCannotClaim", 0, func(t *testing.T, _ *system, w1, w2 *rawWorker, a protocol.TaskAssign) *protocol.WorkerRegistered {
			if ans := w2.register("p9", holdingIt(a)); len(ans.Kept) != 0 {
				t.Errorf("worker w2 kept %+v, an attempt of w1's", ans.Kept)
			}
			ans := w1.register("p1", holdingIt(a))
			return &ans
		}, goesOn},
		{"RegisterMissing", 0, func(_ *testing.T, _ *system, w1, _ *rawWorker, _ protocol.TaskAssign) *protocol.WorkerRegistered {
			ans := w1.register("p2", &protocol.Held{}) // a new process: it holds nothing
			return &ans
		}, lost},
		{"NobodyClaims", 300 * time.Millisecond, func(*testing.T, *system, *rawWorker, *rawWorker, protocol.TaskAssign) *protocol.WorkerRegistered {
			return nil
		}, lost},
		{"ClaimAfterTheGrace", 300 * time.Millisecond, func(t *testing.T, s *system, w1, _ *rawWorker, a protocol.TaskAssign) *protocol.WorkerRegistered {
			s.WaitState(a.JobID, protocol.StateFailed)
			ans := w1.register("p1", holdingIt(a))
			return &ans
		}, lost},
		{"CancelledBeforeTheClaim", 0, func(t *testing.T, s *system, w1, _ *rawWorker, a protocol.TaskAssign) *protocol.WorkerRegistered {
			if ok, _, err := s.Client.Cancel(context.Background(), a.JobID); err != nil || !ok {
				t.Fatalf("cancel: %v %v", ok, err)
			}
			ans := w1.register("p1", holdingIt(a))
			return &ans
		}, cancelled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := reconcileSystem(t)
			w1, w2 := newRawWorker(t, s, "w1"), newRawWorker(t, s, "w2")
			w1.register("p1", nil)
			id := s.Submit("SHA256", text("x"), client.MaxAttempts(1))
			a := w1.nextAssign()
			grace := cmpOr(tc.grace, time.Hour)
			s.RestartCoordinator(t, func(c *coordinator.Config) { c.ClaimGrace = grace })
			if j := s.Status(id); j.State != protocol.StateRunning || j.Attempts != 1 || j.WorkerID == nil || *j.WorkerID != "w1" {
				t.Fatalf("after the restart: job %+v, want RUNNING on w1, its attempt unclaimed", j)
			}
			if tc.name != "AnotherWorkerCannotClaim" {
				w2.register("p9", nil) // a free slot elsewhere
			}
			ans := tc.then(t, s, w1, w2, a)
			if ans != nil {
				claimed := len(ans.Kept) == 1 && ans.Kept[0] == ref(a)
				if claimed != (tc.want == goesOn) {
					t.Errorf("w1's registration kept %+v", ans.Kept)
				}
			}
			// A later job goes to w2 (w1 is full, or lost its slot): the unclaimed job
			// was not queued again before it.
			if tc.want == goesOn {
				later := s.Submit("SHA256", text("later"))
				if b := w2.nextAssign(); b.JobID != later {
					t.Fatalf("w2 was assigned %+v, want the later job %s: the claimed job ran twice", b, later)
				}
			}
			switch tc.want {
			case goesOn:
				if ack := w1.report(a, "done"); !ack.Accepted {
					t.Fatal("the result of the attempt that went on was not accepted")
				}
				if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 || deref(j.Result) != "done" {
					t.Fatalf("job %+v result %q error %q: want COMPLETED on its one attempt", j, deref(j.Result), deref(j.Error))
				}
			case lost:
				j := s.WaitState(id, protocol.StateFailed)
				if deref(j.Error) != "coordinator restarted during final attempt; outcome unknown" || j.Attempts != 1 {
					t.Fatalf("job %+v error %q", j, deref(j.Error))
				}
				if ack := w1.report(a, "late"); ack.Accepted {
					t.Fatal("a result of the lost attempt was accepted")
				}
			case cancelled:
				if j := s.Status(id); j.State != protocol.StateCancelled {
					t.Fatalf("job %+v, want CANCELLED", j)
				}
				if ack := w1.report(a, "late"); ack.Accepted {
					t.Fatal("a result of the cancelled attempt was accepted")
				}
			}
		})
	}
}

// TestUnclaimedAttemptKeepsItsDeadline: an attempt waiting for its worker still has the
// execution deadline it started with, counted from its assignment before the restart.
func TestUnclaimedAttemptKeepsItsDeadline(t *testing.T) {
	t.Parallel()
	s := setup(t, func(c *coordinator.Config) { c.TaskTimeout, c.HeartbeatTimeout = 600*time.Millisecond, time.Hour })
	w := newRawWorker(t, s, "w1")
	w.register("p1", nil)
	id := s.Submit("SHA256", text("x"), client.MaxAttempts(1))
	w.nextAssign()
	s.RestartCoordinator(t, func(c *coordinator.Config) { c.ClaimGrace = time.Hour })
	j := s.WaitState(id, protocol.StateFailed)
	if e := deref(j.Error); e != "execution deadline exceeded (600 ms) on worker w1 (all 1 attempts used)" {
		t.Fatalf("job %+v error %q", j, e)
	}
}

func cmpOr(d, or time.Duration) time.Duration {
	if d != 0 {
		return d
	}
	return or
}

// TestFailoverKeepsRunningAttempt: a standby that takes over finds a job RUNNING on
// its only attempt; the worker, told of the new leader by its announcement (its own
// heartbeat is an hour away), registers with it, reports the attempt and keeps it,
// and the job completes on that attempt.
func TestFailoverKeepsRunningAttempt(t *testing.T) {
	t.Parallel()
	s := setup(t)
	_ = s.Coordinator.Close()
	cfg := s.Config
	cfg.LeaderLease = 600 * time.Millisecond
	cfg.HeartbeatTimeout = time.Hour
	first, stopFirst := stoppableCampaign(t, s, cfg)
	c1 := recv(t, "the first leader", first)
	s.StartNativeWorker(t, worker.WithCapacity(1), worker.WithHeartbeat(time.Hour))
	s.Eventually("the worker registered", func() bool { return len(c1.Stats().Workers) == 1 })
	second, _ := stoppableCampaign(t, s, cfg)
	id := s.Submit("SLEEP", map[string]int{"durationMillis": 1500}, client.MaxAttempts(1))
	s.WaitState(id, protocol.StateRunning)

	stopFirst()
	recv(t, "the standby leading", second)
	if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 {
		t.Fatalf("job %+v error %q, want COMPLETED on its one attempt", j, deref(j.Error))
	}
}
