package suite

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// Delayed jobs (runAtMillis, runInMillis: SCHEDULED until due) and snoozes (a result's
// snoozeMillis), over every transport.

// ResultSender is a peer that sends a TASK_RESULT as the test writes it.
type ResultSender interface {
	SendResult(res *protocol.TaskResult) *protocol.ResultAck
}

// SendResult sends res as it is.
func (m *BusPeer) SendResult(res *protocol.TaskResult) *protocol.ResultAck {
	m.s.t.Helper()
	ack, err := bus.Ask[protocol.ResultAck](context.Background(), m.node, coordinatorAddr, protocol.PathResult, res)
	Must(m.s.t, err)
	return &ack
}

// SendResult sends res as it is; there is no acknowledgement on the worker port.
func (p *tcpPeer) SendResult(res *protocol.TaskResult) *protocol.ResultAck {
	if err := p.current().Send(res); err != nil && !errors.Is(err, net.ErrClosed) {
		p.s.t.Fatal(err)
	}
	return nil
}

// runTimes sets both run times, as no client option does.
func runTimes(at, in int64) client.SubmitOption {
	return func(s *protocol.SubmitJob) { s.RunAtMillis, s.RunInMillis = at, in }
}

func testDelayed(t *testing.T, tr Transport) {
	t.Run("ScheduledUntilDueThenRuns", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr)
		m := s.ManualWorker("w", 1)
		const delay = 1500 * time.Millisecond
		before := time.Now()
		id := s.Submit("SHA256", Text("later"), client.RunIn(delay), client.Priority(protocol.PriorityHigh))
		after := time.Now()
		j := s.Status(id)
		due := time.UnixMilli(j.RunAtMillis)
		if due.Before(before.Add(delay).Truncate(time.Millisecond)) || due.After(after.Add(delay)) {
			t.Fatalf("runAtMillis %v, want %v after the submission (between %v and %v)", due, delay, before, after)
		}
		if time.Now().Before(due) && j.State != protocol.StateScheduled {
			t.Fatalf("before its due time: %+v, want SCHEDULED", j)
		}
		list, err := s.Client.List(context.Background(), protocol.ListJobs{State: ptr(protocol.StateScheduled)})
		Must(t, err)
		if time.Now().Before(due) && (len(list.Jobs) != 1 || list.Jobs[0].JobID != id || list.Jobs[0].RunAtMillis != j.RunAtMillis) {
			t.Fatalf("SCHEDULED list %+v, want job %s due %d", list.Jobs, id, j.RunAtMillis)
		}
		a := s.NextAssign(m)
		if now := time.Now(); a.JobID != id || now.Before(due) {
			t.Fatalf("assigned %+v at %v, want job %s not before %v", a, now, id, due)
		}
		s.Accept(m, a, true, "done")
		if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 || j.Priority != protocol.PriorityHigh || j.RunAtMillis != due.UnixMilli() {
			t.Fatalf("job %+v, want COMPLETED on attempt 1, HIGH, due time kept", j)
		}
	})
	t.Run("DueTimeInThePastRunsNow", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr)
		s.StartWorker(1)
		id := s.Submit("SHA256", Text("now"), client.RunAt(time.Now().Add(-time.Hour)))
		if j := s.Wait(id); j.State != protocol.StateCompleted {
			t.Fatalf("job %+v", j)
		}
	})
	t.Run("CancelWhileScheduled", func(t *testing.T) {
		t.Parallel()
		// The coordinator's clock moves only when the test moves it, so each cancel
		// lands before its job is due however slow the machine, and the worker is not
		// lost meanwhile. A window of a minute: the near job stays in memory with its
		// timer, the far one leaves it (held by its index entry).
		clk := jobbustest.NewClock(time.Now())
		s := Setup(t, tr, func(c *coordinator.Config) {
			c.Now, c.ScheduleWindow, c.HeartbeatTimeout = clk.Now, time.Minute, 48*time.Hour
		})
		m := s.ManualWorker("w", 1)
		for _, in := range []time.Duration{time.Second, time.Hour} {
			id := s.Submit("SHA256", Text("never"), client.RunIn(in))
			ok, j, err := s.Client.Cancel(context.Background(), id)
			Must(t, err)
			if !ok || j.State != protocol.StateCancelled || Deref(j.Error) != "cancelled by client request" || j.Attempts != 0 {
				t.Fatalf("cancel of a job due in %v: %v %+v", in, ok, j)
			}
		}
		// Each sentinel is due just after a cancelled job: that job, had it run, would
		// have been assigned first.
		for _, step := range []struct{ in, advance time.Duration }{{1200 * time.Millisecond, 2 * time.Second}, {2 * time.Hour, 3 * time.Hour}} {
			sentinel := s.Submit("SHA256", Text("runs"), client.RunIn(step.in))
			clk.Advance(step.advance)
			a := s.NextAssign(m)
			if a.JobID != sentinel {
				t.Fatalf("assigned %+v: a cancelled scheduled job ran", a)
			}
			s.Accept(m, a, true, "done")
		}
	})
	t.Run("IdempotencyKey", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr, func(c *coordinator.Config) { c.ScheduleWindow = 50 * time.Millisecond })
		first := s.Submit("SHA256", Text("once"), client.RunIn(time.Hour), client.IdempotencyKey("k"))
		// Again (it has left memory as its create became durable): the same job,
		// whatever run time is asked.
		if again := s.Submit("SHA256", Text("once"), client.RunIn(2*time.Hour), client.IdempotencyKey("k")); again != first {
			t.Fatalf("resubmitted under its key: %s, want %s", again, first)
		}
		_, err := s.Client.Submit(context.Background(), "SHA256", Text("other"), client.RunIn(time.Hour), client.IdempotencyKey("k"))
		if err == nil || !strings.Contains(err.Error(), "already bound to a different submission (job "+first+")") {
			t.Fatalf("other payload under the key: %v", err)
		}
		s.RestartCoordinator(t)
		if again := s.Submit("SHA256", Text("once"), client.RunIn(time.Hour), client.IdempotencyKey("k")); again != first {
			t.Fatalf("after a restart: %s, want %s", again, first)
		}
	})
	t.Run("InvalidRunTimes", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr)
		now := time.Now().UnixMilli()
		for _, tc := range []struct {
			name string
			opt  client.SubmitOption
			want string
		}{
			{"Both", runTimes(now+1000, 1000), "Invalid run time: give runAtMillis or runInMillis, not both"},
			{"NegativeDelay", runTimes(0, -5), "Invalid run time: runInMillis must be at least 0, got -5"},
			{"Seconds", runTimes(now/1000, 0), "(seconds given?)"},
		} {
			_, err := s.Client.Submit(context.Background(), "SHA256", Text("x"), tc.opt)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
			}
		}
	})
	t.Run("AdmissionBoundsScheduledApart", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr, func(c *coordinator.Config) { c.MaxActiveJobs, c.MaxScheduledJobs = 1, 2 })
		for range 2 {
			s.Submit("SHA256", Text("later"), client.RunIn(time.Hour))
		}
		_, err := s.Client.Submit(context.Background(), "SHA256", Text("later"), client.RunIn(time.Hour))
		var rej *client.RejectedError
		want := protocol.SubmitRejected{Reason: "coordinator at capacity: 2 scheduled jobs (limit 2)", ActiveCount: 2, Limit: 2, Retryable: true}
		if !errors.As(err, &rej) || rej.SubmitRejected != want {
			t.Fatalf("third scheduled job: %v, want %+v", err, want)
		}
		// Scheduled jobs leave MaxActiveJobs to the work of now.
		s.Submit("SHA256", Text("now"))
		_, err = s.Client.Submit(context.Background(), "SHA256", Text("now"))
		want = protocol.SubmitRejected{Reason: "coordinator at capacity: 1 active jobs (limit 1)", ActiveCount: 1, Limit: 1, Retryable: true}
		if !errors.As(err, &rej) || rej.SubmitRejected != want {
			t.Fatalf("second job of now: %v, want %+v", err, want)
		}
		// The counts are rebuilt on restart.
		s.RestartCoordinator(t)
		_, err = s.Client.Submit(context.Background(), "SHA256", Text("later"), client.RunIn(time.Hour))
		if !errors.As(err, &rej) || rej.ActiveCount != 2 || rej.Limit != 2 {
			t.Fatalf("after restart: %v %+v", err, rej)
		}
	})
	t.Run("RestartWhileScheduledChangesNothing", func(t *testing.T) {
		t.Parallel()
		// The coordinator's clock moves only when the test moves it: the near job is
		// still SCHEDULED after a restart however long the restart takes, and the
		// worker is not lost meanwhile.
		clk := jobbustest.NewClock(time.Now())
		s := Setup(t, tr, func(c *coordinator.Config) {
			c.Now, c.ScheduleWindow, c.HeartbeatTimeout = clk.Now, 100*time.Millisecond, 48*time.Hour
		})
		near := s.Submit("SHA256", Text("near"), client.RunIn(2*time.Second))
		far := s.Submit("SHA256", Text("far"), client.RunIn(time.Hour), client.IdempotencyKey("far"))
		before := map[string]protocol.Job{near: s.Status(near), far: s.Status(far)}
		s.RestartCoordinator(t)
		for id, b := range before {
			if a := s.Status(id); a.State != protocol.StateScheduled || a.RunAtMillis != b.RunAtMillis || a.CreatedAtMillis != b.CreatedAtMillis {
				t.Fatalf("after restart %+v, before %+v", a, b)
			}
		}
		m := s.ManualWorker("w", 1)
		clk.Advance(3 * time.Second) // the near job is due, the far one is not
		a := s.NextAssign(m)
		if a.JobID != near || clk.Now().Before(time.UnixMilli(before[near].RunAtMillis)) {
			t.Fatalf("assigned %+v, want job %s once due", a, near)
		}
		s.Accept(m, a, true, "done")
		if j := s.Status(far); j.State != protocol.StateScheduled {
			t.Fatalf("far job %+v, want SCHEDULED", j)
		}
		ok, j, err := s.Client.Cancel(context.Background(), far)
		Must(t, err)
		if !ok || j.State != protocol.StateCancelled {
			t.Fatalf("cancel after restart: %v %+v", ok, j)
		}
	})
}

func testSnooze(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	m := s.ManualWorker("w", 1)
	id := s.Submit("SHA256", Text("poll"), client.MaxAttempts(1))
	a := s.NextAssign(m)
	snoozed := time.Now().Truncate(time.Millisecond) // the coordinator's due time is in milliseconds
	res := Result(m.ID(), a, false, "not ready")
	res.SnoozeMillis = 300
	if ack := m.(ResultSender).SendResult(res); ack != nil && !ack.Accepted {
		t.Fatalf("snooze not accepted: %+v", ack)
	}
	again := s.NextAssign(m)
	if again.JobID != id || again.AttemptNumber != 1 || time.Since(snoozed) < 300*time.Millisecond {
		t.Fatalf("assigned %+v %v after the snooze, want job %s's attempt 1 again, not before 300ms", again, time.Since(snoozed), id)
	}
	if j := s.Status(id); j.State != protocol.StateRunning || j.Attempts != 1 || j.Snoozes != 1 {
		t.Fatalf("after the snooze %+v, want RUNNING attempt 1 of 1, snoozed once", j)
	}
	s.Accept(m, again, true, "ready")
	if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 || j.Snoozes != 1 {
		t.Fatalf("job %+v, want COMPLETED on its one attempt after a snooze", j)
	}
}

func ptr[T any](v T) *T { return &v }
