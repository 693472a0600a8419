package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tasks"
)

// TestParentResultsInHandler: a step's handler reads its parents' results.
func TestParentResultsInHandler(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("JOIN", func(ctx context.Context, _ int, _ json.RawMessage) (string, error) {
			ps, err := worker.ParentResults(ctx)
			if err != nil {
				return "", err
			}
			var parts []string
			for _, p := range ps {
				parts = append(parts, p.Step+"="+deref(p.Result))
			}
			return strings.Join(parts, ","), nil
		})
	}, worker.WithTasks(tasks.NewRegistry()), worker.WithID("join"))
	s.StartWorker(2)
	s.Eventually("join registered", func() bool { return s.HasWorker("join") })
	w := client.NewWorkflow("pr").Step("a", "WORD_COUNT", text("one two")).Step("b", "WORD_COUNT", text("x")).
		Step("j", "JOIN", rawJSON(`{}`), client.StepAfter("a", "b"))
	sub := s.SubmitWorkflow(w)
	if j := s.Wait(sub.Jobs["j"]); j.State != protocol.StateCompleted || deref(j.Result) != "a=2,b=1" {
		t.Fatalf("join %s %q %q, want the parents' results a=2,b=1", j.State, deref(j.Result), deref(j.Error))
	}
	if _, err := worker.ParentResults(context.Background()); err == nil {
		t.Fatal("ParentResults outside a handler: no error")
	}
}

// TestLargeWorkflows: a 1,000-way fan-out with a fan-in (1,002 jobs, one atomic
// batch, above nats-server's default batch limit) runs to the end; a 10,000-step
// chain is stored at once, waits step by step, and cancels whole.
func TestLargeWorkflows(t *testing.T) {
	t.Parallel()
	s := setup(t, func(c *coordinator.Config) { c.MaxActiveJobs = 20_000 })
	s.StartWorker(64)
	const fan = 1000
	w := client.NewWorkflow("fan").Step("split", "SHA256", text("in"))
	var names []string
	for i := range fan {
		names = append(names, fmt.Sprintf("p%d", i))
		w.Step(names[i], "SHA256", text(fmt.Sprint(i)), client.StepAfter("split"))
	}
	w.Step("join", "SHA256", text("out"), client.StepAfter(names...))
	s.SubmitWorkflow(w)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := s.Client.WaitWorkflow(ctx, "fan")
	if err != nil || st.State != "COMPLETED" || st.Counts[protocol.StateCompleted] != fan+2 {
		t.Fatalf("fan-out: %v %s %v", err, st.State, st.Counts)
	}

	const n = protocol.MaxWorkflowSteps
	chain := client.NewWorkflow("chain")
	var all []string
	for i := range n {
		all = append(all, fmt.Sprintf("c%d", i))
		chain.Step(all[i], "SLEEP", json.RawMessage(`{"durationMillis":60000}`))
	}
	chain.Chain(all...)
	slow := client.New(s.NC, client.WithTimeout(time.Minute)) // -race on a loaded machine
	if _, err := slow.SubmitWorkflow(ctx, chain); err != nil {
		t.Fatal(err)
	}
	st, err = s.Client.WorkflowStatus(ctx, "chain")
	if err != nil || st.Counts[protocol.StateWaiting] != n-1 || (len(st.Steps) != n && !st.Truncated) {
		t.Fatalf("chain: %v %v (%d steps, truncated %v), want %d WAITING", err, st.Counts, len(st.Steps), st.Truncated, n-1)
	}
	if got, err := slow.CancelWorkflow(ctx, "chain"); err != nil || got != n {
		t.Fatalf("cancel chain: %d %v", got, err)
	}
	if st, _ := s.Client.WorkflowStatus(ctx, "chain"); st.State != "CANCELLED" || st.Counts[protocol.StateCancelled] != n {
		t.Fatalf("chain after cancel: %s %v", st.State, st.Counts)
	}
}

// TestWorkflowAtCapacity: a workflow that does not fit in the admission limit is
// rejected whole (retryable), and nothing of it exists.
func TestWorkflowAtCapacity(t *testing.T) {
	t.Parallel()
	s := setup(t, func(c *coordinator.Config) { c.MaxActiveJobs = 5 })
	w := client.NewWorkflow("big")
	for i := range 6 {
		w.Step(fmt.Sprintf("s%d", i), "SHA256", text("x"))
	}
	_, err := s.Client.SubmitWorkflow(context.Background(), w)
	if !errors.Is(err, client.ErrRejected) {
		t.Fatalf("submit of 6 steps over a limit of 5: %v, want a rejection", err)
	}
	if _, err := s.Client.WorkflowStatus(context.Background(), "big"); err == nil || !strings.Contains(err.Error(), "Unknown workflow") {
		t.Fatalf("status of the rejected workflow: %v", err)
	}
	// The id is free again.
	w2 := client.NewWorkflow("big").Step("a", "SHA256", text("x"))
	s.SubmitWorkflow(w2)
}

// TestAfterFarScheduledParentWaits: a job after a SCHEDULED job due beyond the
// schedule window (held out of memory by its index entry) waits for it, across a
// restart too, and is cancelled when it is; one after a parent that snoozed that far
// waits for it as well.
func TestAfterFarScheduledParentWaits(t *testing.T) {
	t.Parallel()
	s := setup(t, func(c *coordinator.Config) { c.ScheduleWindow = time.Minute })
	s.StartWorker(2)
	p := s.Submit("SHA256", text("p"), client.RunIn(time.Hour))
	c := s.Submit("SHA256", text("c"), client.After(p))
	if j := s.Status(c); j.State != protocol.StateWaiting {
		t.Fatalf("job after a parent SCHEDULED in an hour is %s, want WAITING", j.State)
	}
	s.RestartCoordinator(t)
	s.StartWorker(2)
	if j := s.Status(c); j.State != protocol.StateWaiting {
		t.Fatalf("after a restart the job is %s %q, want WAITING", j.State, deref(j.Error))
	}
	if _, _, err := s.Client.Cancel(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if j := s.Wait(c); j.State != protocol.StateCancelled || deref(j.Error) != "parent job "+p+" ended CANCELLED" {
		t.Fatalf("once its parent was cancelled the job is %s %q, want CANCELLED naming it", j.State, deref(j.Error))
	}

	// A parent that snoozes beyond the window leaves memory the same way.
	s.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("NAP", func(context.Context, int, json.RawMessage) (string, error) {
			return "", worker.Snooze(time.Hour)
		})
	}, worker.WithTasks(tasks.NewRegistry()), worker.WithID("nap"))
	s.Eventually("nap registered", func() bool { return s.HasWorker("nap") })
	n := s.Submit("NAP", rawJSON(`{}`))
	k := s.Submit("SHA256", text("k"), client.After(n))
	s.WaitState(n, protocol.StateScheduled)
	if _, _, err := s.Client.Cancel(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if j := s.Wait(k); j.State != protocol.StateCancelled {
		t.Fatalf("job after a snoozed parent that was cancelled is %s, want CANCELLED", j.State)
	}
}

// TestAfterExpiredParentAcrossRestart: a job submitted after a COMPLETED parent and an
// active one still waits for the active one after a restart that comes once the
// completed parent's retention ended, and then runs: an expired parent had ended
// before its child was admitted, which admits only after a COMPLETED one.
func TestAfterExpiredParentAcrossRestart(t *testing.T) {
	t.Parallel()
	s := setup(t, withRetention(time.Second))
	_, stop := s.StartWorker(1)
	a := s.Submit("SHA256", text("a"))
	if j := s.Wait(a); j.State != protocol.StateCompleted {
		t.Fatalf("parent %s, want COMPLETED", j.State)
	}
	stop()
	b := s.Submit("SHA256", text("b")) // no worker: it stays QUEUED
	c := s.Submit("SHA256", text("c"), client.After(a, b))
	if j := s.Status(c); j.State != protocol.StateWaiting {
		t.Fatalf("child %s, want WAITING for %s", j.State, b)
	}
	s.Eventually("the completed parent expired", func() bool { return gone(s, a) })
	s.RestartCoordinator(t)
	if j := s.Status(c); j.State != protocol.StateWaiting {
		t.Fatalf("after a restart the child is %s %q, want still WAITING for %s", j.State, deref(j.Error), b)
	}
	s.StartWorker(1)
	if j := s.Wait(c); j.State != protocol.StateCompleted {
		t.Fatalf("child %s %q, want COMPLETED once %s completed", j.State, deref(j.Error), b)
	}
}

// TestWorkflowCancelSnoozedStep: a step that snoozed beyond the schedule window, which
// waits out of memory (as a restart leaves it), still runs for the workflow's retry,
// which is refused, and its cancel cancels it.
func TestWorkflowCancelSnoozedStep(t *testing.T) {
	t.Parallel()
	s := setup(t, func(c *coordinator.Config) { c.ScheduleWindow = time.Minute })
	s.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("NAP", func(context.Context, int, json.RawMessage) (string, error) {
			return "", worker.Snooze(time.Hour)
		})
	}, worker.WithTasks(tasks.NewRegistry()), worker.WithID("nap"))
	s.Eventually("nap registered", func() bool { return s.HasWorker("nap") })
	s.StartWorker(1)
	sub := s.SubmitWorkflow(client.NewWorkflow("naps").Step("z", "NAP", rawJSON(`{}`)).
		Step("f", "FAIL", map[string]int{"failUntilAttempt": 5}, client.StepMaxAttempts(1)))
	s.WaitState(sub.Jobs["f"], protocol.StateFailed)
	s.WaitState(sub.Jobs["z"], protocol.StateScheduled)
	s.Eventually("the snooze stored", func() bool { return storedState(s, sub.Jobs["z"]) == protocol.StateScheduled })
	s.RestartCoordinator(t)
	if j := s.Status(sub.Jobs["z"]); j.State != protocol.StateScheduled {
		t.Fatalf("after a restart the snoozed step is %s, want SCHEDULED", j.State)
	}
	if jobs, err := s.Client.RetryWorkflow(context.Background(), "naps"); err == nil || !strings.Contains(err.Error(), "still runs") {
		t.Fatalf("retry while a step is SCHEDULED: %v %v, want refused", jobs, err)
	}
	n, err := s.Client.CancelWorkflow(context.Background(), "naps")
	if err != nil || n != 1 {
		t.Fatalf("cancel: %d %v, want 1 step cancelled", n, err)
	}
	if j := s.Status(sub.Jobs["z"]); j.State != protocol.StateCancelled {
		t.Fatalf("the snoozed step is %s after its workflow's cancel, want CANCELLED", j.State)
	}
}

// storedState is the state in job id's record as stored in the jobs bucket.
func storedState(s *system, id string) protocol.State {
	s.T().Helper()
	js, err := jetstream.New(s.NC)
	must(s.T(), err)
	kv, err := js.KeyValue(context.Background(), protocol.JobsBucket)
	must(s.T(), err)
	e, err := kv.Get(context.Background(), id)
	if err != nil {
		return ""
	}
	var r protocol.Record
	must(s.T(), json.Unmarshal(e.Value(), &r))
	return r.State
}

// TestWorkflowKeptWhileAStepIsKept: a workflow whose first step's record expired
// (retention) while a later step is still kept is still known after a restart: its
// status answers, with the later step's end.
func TestWorkflowKeptWhileAStepIsKept(t *testing.T) {
	t.Parallel()
	s := setup(t, withRetention(time.Second))
	s.StartWorker(2)
	sub := s.SubmitWorkflow(client.NewWorkflow("early").Step("first", "SHA256", text("x")).
		Step("long", "SLEEP", map[string]int{"durationMillis": 600_000}))
	first, long := sub.Jobs["first"], sub.Jobs["long"]
	s.Wait(first)
	s.WaitState(long, protocol.StateRunning)
	s.Eventually("the first step expired", func() bool { return gone(s, first) })
	// The long step ends under a long retention, so that it is kept from here on.
	s.RestartCoordinator(t, withRetention(time.Hour))
	if ok, _, err := s.Client.Cancel(context.Background(), long); err != nil || !ok {
		t.Fatalf("cancel the long step: %v %v", ok, err)
	}
	s.Wait(long)
	s.RestartCoordinator(t)
	st, err := s.Client.WorkflowStatus(context.Background(), "early")
	if err != nil {
		t.Fatalf("status after a restart, its step %s still kept: %v", long, err)
	}
	if st.State != string(protocol.StateCancelled) || st.Steps[1].State != protocol.StateCancelled {
		t.Fatalf("status %+v, want CANCELLED with the long step CANCELLED", st)
	}
}

// TestWorkflowWithAnExpiredStepIsNotCompleted: a workflow one of whose steps failed
// and whose record expired (retention) before the others ended reads UNKNOWN after a
// restart, not COMPLETED: a workflow is COMPLETED only if every step is known to have
// completed.
func TestWorkflowWithAnExpiredStepIsNotCompleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setup(t, withRetention(time.Second))
	s.StartWorker(2)
	// A limit of one SHA256 a day, its token spent: the "ok" step waits QUEUED.
	_, err := s.Client.SetLimit(ctx, client.ForTaskType("SHA256"), "1/d", 1)
	must(t, err)
	s.Wait(s.Submit("SHA256", text("spends the token")))
	sub := s.SubmitWorkflow(client.NewWorkflow("mixed").Step("ok", "SHA256", text("x")).
		Step("bad", "FAIL", map[string]int{"failUntilAttempt": 5}, client.StepMaxAttempts(1)))
	ok, bad := sub.Jobs["ok"], sub.Jobs["bad"]
	if j := s.Wait(bad); j.State != protocol.StateFailed {
		t.Fatalf("bad step %+v, want FAILED", j)
	}
	s.Eventually("the failed step expired", func() bool { return gone(s, bad) })
	if j := s.Status(ok); j.State != protocol.StateQueued {
		t.Fatalf("ok step %+v, want QUEUED behind the limit", j)
	}
	s.RestartCoordinator(t, withRetention(time.Hour))
	_, err = s.Client.RemoveLimit(ctx, client.ForTaskType("SHA256"))
	must(t, err)
	if j := s.Wait(ok); j.State != protocol.StateCompleted {
		t.Fatalf("ok step %+v, want COMPLETED", j)
	}
	st, err := s.Client.WorkflowStatus(ctx, "mixed")
	must(t, err)
	if st.State != "UNKNOWN" || st.Steps[1].State != "UNKNOWN" {
		t.Fatalf("status %+v: a workflow whose failed step expired reads %s, want UNKNOWN", st, st.State)
	}
}

// TestWorkflowForgottenOnceItsStepsExpired: a workflow whose steps all expired
// (retention) is forgotten, its control removed, by the coordinator that saw them end
// as by one that recovers: its status is Unknown workflow, and its id is free again, so
// the same workflow sent again is stored and runs. Before, the coordinator that saw
// them end held it until it stopped (its status still answered its steps' ends, and
// sent again it was answered with its expired jobs, so nothing ran); and the one that
// recovered refused it sent again as "already exists with another definition", since
// its control's removal left a purge marker that the new control's create, expecting
// no message under the key, took for another workflow's.
func TestWorkflowForgottenOnceItsStepsExpired(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "SameCoordinator", true: "AfterARestart"}[restart], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := setup(t, withRetention(time.Second))
			s.StartWorker(2)
			wf := func() *client.Workflow {
				return client.NewWorkflow("daily").Step("a", "SHA256", text("x")).
					Step("b", "SHA256", text("y"), client.StepAfter("a"))
			}
			sub := s.SubmitWorkflow(wf())
			if st := s.WaitWorkflow("daily"); st.State != string(protocol.StateCompleted) {
				t.Fatalf("workflow %+v, want COMPLETED", st)
			}
			s.Eventually("its steps expired", func() bool { return gone(s, sub.Jobs["a"]) && gone(s, sub.Jobs["b"]) })
			if restart {
				s.RestartCoordinator(t)
			}
			if st, err := s.Client.WorkflowStatus(ctx, "daily"); err == nil || !strings.Contains(err.Error(), "Unknown workflow") {
				t.Fatalf("status of a workflow whose steps expired: %+v, %v; want Unknown workflow", st, err)
			}
			again, err := s.Client.SubmitWorkflow(ctx, wf())
			if err != nil {
				t.Fatalf("the same workflow sent again once its steps expired: %v", err)
			}
			if st := s.WaitWorkflow("daily"); st.State != string(protocol.StateCompleted) {
				t.Fatalf("workflow sent again: %+v, want COMPLETED", st)
			}
			if j := s.Status(again.Jobs["b"]); j.State != protocol.StateCompleted {
				t.Fatalf("its step b: %+v, want COMPLETED", j)
			}
		})
	}
}

// TestParentExpiredBeforeItsChildRan: a job whose parent's record expired
// (retention) before it ran, held QUEUED in a paused queue, reads that parent UNKNOWN,
// without a result, as workflow status reads a step whose record expired. Before, the
// parent's state was empty, none of the states the protocol names.
func TestParentExpiredBeforeItsChildRan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setup(t, withRetention(time.Second))
	s.StartWorker(1)
	s.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("JOIN", func(ctx context.Context, _ int, _ json.RawMessage) (string, error) {
			ps, err := worker.ParentResults(ctx)
			if err != nil {
				return "", err
			}
			var parts []string
			for _, p := range ps {
				part := fmt.Sprintf("%s=%s", p.JobID, p.State)
				if p.Result != nil {
					part += ":" + *p.Result
				}
				parts = append(parts, part)
			}
			return strings.Join(parts, ","), nil
		})
	}, worker.WithTasks(tasks.NewRegistry()), worker.WithID("join"), worker.WithQueues(protocol.QueueWeight{Name: "later", Weight: 1}))
	s.Eventually("join registered", func() bool { return s.HasWorker("join") })
	_, err := s.Client.PauseQueue(ctx, "later")
	must(t, err)
	parent := s.Submit("SHA256", text("parent"))
	s.Wait(parent)
	child := s.Submit("JOIN", rawJSON(`{}`), client.After(parent), client.Queue("later"))
	s.Eventually("the parent expired", func() bool { return gone(s, parent) })
	_, err = s.Client.ResumeQueue(ctx, "later")
	must(t, err)
	want := parent + "=UNKNOWN"
	if j := s.Wait(child); j.State != protocol.StateCompleted || deref(j.Result) != want {
		t.Fatalf("child %s %q %q, want its expired parent read %s", j.State, deref(j.Result), deref(j.Error), want)
	}
}

// TestWorkflowForgottenOnceItsStepsExpiredAfterARestart: a workflow that ended before
// a restart, its steps still kept then, is forgotten once they expired too, though the
// coordinator that recovered never saw them end: its status is Unknown workflow, and
// the same workflow sent again runs. Before, its status read UNKNOWN with every step
// UNKNOWN, and sent again it was answered with its expired jobs: nothing ran.
func TestWorkflowForgottenOnceItsStepsExpiredAfterARestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setup(t, withRetention(2*time.Second))
	s.StartWorker(2)
	wf := func() *client.Workflow {
		return client.NewWorkflow("nightly").Step("a", "SHA256", text("x")).
			Step("b", "SHA256", text("y"), client.StepAfter("a"))
	}
	sub := s.SubmitWorkflow(wf())
	if st := s.WaitWorkflow("nightly"); st.State != string(protocol.StateCompleted) {
		t.Fatalf("workflow %+v, want COMPLETED", st)
	}
	s.RestartCoordinator(t) // nobody asks it about the workflow until its steps expired
	s.Eventually("its steps expired", func() bool { return gone(s, sub.Jobs["a"]) && gone(s, sub.Jobs["b"]) })
	if st, err := s.Client.WorkflowStatus(ctx, "nightly"); err == nil || !strings.Contains(err.Error(), "Unknown workflow") {
		t.Fatalf("status of a workflow whose steps expired: %+v, %v; want Unknown workflow", st, err)
	}
	again, err := s.Client.SubmitWorkflow(ctx, wf())
	if err != nil {
		t.Fatalf("the same workflow sent again once its steps expired: %v", err)
	}
	if st := s.WaitWorkflow("nightly"); st.State != string(protocol.StateCompleted) {
		t.Fatalf("workflow sent again: %+v, want COMPLETED", st)
	}
	if j := s.Status(again.Jobs["b"]); j.State != protocol.StateCompleted {
		t.Fatalf("its step b: %+v, want COMPLETED", j)
	}
}
