package client_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// aReply cuts a NATS connection where the server delivers a reply to a request (a
// message on an inbox), before the client reads it.
func aReply(seen []byte) bool { return bytes.Contains(seen, []byte("MSG _INBOX.")) }

// cutOffClient is a client of s whose NATS connection (without reconnect, as the
// CLI's one-shot commands) is cut where the coordinator's answer to a request comes.
func cutOffClient(t *testing.T, s *jobbustest.System) *client.Client {
	t.Helper()
	nc, err := nats.Connect("nats://"+cutReplies(t, s.Server.NATS().Addr().String(), aReply), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return client.New(nc)
}

// TestSubmitCutOffByTheConnectionIsOutcomeUnknown: a submission whose NATS connection
// closes after the coordinator took it, before its answer came (NATS restarted under a
// client that does not reconnect, as the CLI's one-shot commands), may be stored: its
// error says the outcome is unknown and names its job, and here that job was stored.
// The error was the connection's, "nats: connection closed", which says not stored.
// So for SubmitMany, whose submissions each name their own job.
func TestSubmitCutOffByTheConnectionIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s := jobbustest.Start(t)
	native := client.New(s.NC)
	storedIDs := func() map[string]bool {
		list, err := native.List(context.Background(), protocol.ListJobs{})
		if err != nil {
			t.Fatal(err)
		}
		ids := make(map[string]bool)
		for _, j := range list.Jobs {
			ids[j.JobID] = true
		}
		return ids
	}
	cutOff := func(t *testing.T) *client.Client { return cutOffClient(t, s) }

	t.Run("Submit", func(t *testing.T) {
		_, err := cutOff(t).Submit(context.Background(), "SHA256", map[string]string{"text": "cut"})
		id, named := client.OutcomeJob(err)
		if !errors.Is(err, client.ErrOutcomeUnknown) || !named {
			t.Fatalf("Submit cut off before its answer = %v; want an error matching ErrOutcomeUnknown, naming its job", err)
		}
		if !storedIDs()[id] {
			t.Fatalf("the job the error names, %s, is not stored: %v", id, err)
		}
	})
	t.Run("SubmitMany", func(t *testing.T) {
		res, err := cutOff(t).SubmitMany(context.Background(), []client.Submission{
			{TaskType: "SHA256", Payload: map[string]string{"text": "cut 1"}},
			{TaskType: "SHA256", Payload: map[string]string{"text": "cut 2"}},
		})
		if !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Errorf("SubmitMany cut off before its answer = %v; want an error matching ErrOutcomeUnknown", err)
		}
		stored := storedIDs()
		for i, r := range res {
			if id, named := client.OutcomeJob(r.Err); !errors.Is(r.Err, client.ErrOutcomeUnknown) || !named || !stored[id] {
				t.Errorf("submission %d cut off before its answer = %q, %v; want an error matching ErrOutcomeUnknown, naming its stored job", i, r.JobID, r.Err)
			}
		}
	})
}

// TestCancelAndWorkflowCutOffByTheConnectionAreOutcomeUnknown: a cancel, or a
// workflow's submission, whose NATS connection closes after the coordinator took it,
// before its answer came, may have been acted on: its error says the outcome is unknown
// and names its job (its workflow), and here the cancel was applied and the workflow
// stored. The error was the connection's, "nats: connection closed", as a submission's
// was before it said so.
func TestCancelAndWorkflowCutOffByTheConnectionAreOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s := jobbustest.Start(t)
	native := client.New(s.NC)
	ctx := context.Background()
	cutOff := func(t *testing.T) *client.Client { return cutOffClient(t, s) }

	t.Run("Cancel", func(t *testing.T) {
		id, err := native.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 60000})
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = cutOff(t).Cancel(ctx, id)
		named, ok := client.OutcomeJob(err)
		if !errors.Is(err, client.ErrOutcomeUnknown) || !ok || named != id {
			t.Fatalf("Cancel cut off before its answer = %v; want an error matching ErrOutcomeUnknown, naming job %s", err, id)
		}
		if job, err := native.Status(ctx, id); err != nil || job.State != protocol.StateCancelled {
			t.Fatalf("job %s after the cut-off cancel: %s, %v; want CANCELLED", id, job.State, err)
		}
	})
	t.Run("Workflow", func(t *testing.T) {
		w := client.NewWorkflow("").
			Step("a", "SLEEP", map[string]int{"durationMillis": 60000}).
			Step("b", "SLEEP", map[string]int{"durationMillis": 1}).Chain("a", "b")
		_, err := cutOff(t).SubmitWorkflow(ctx, w)
		id, ok := client.OutcomeWorkflow(err)
		if !errors.Is(err, client.ErrOutcomeUnknown) || !ok {
			t.Fatalf("SubmitWorkflow cut off before its answer = %v; want an error matching ErrOutcomeUnknown, naming its workflow", err)
		}
		if st, err := native.WorkflowStatus(ctx, id); err != nil || len(st.Steps) != 2 {
			t.Fatalf("workflow %s after the cut-off submission: %+v, %v; want it stored, with its 2 steps", id, st, err)
		}
		// Sent again, it is answered with the jobs stored the first time.
		again, err := native.SubmitWorkflow(ctx, w)
		if err != nil || again.WorkflowID != id || len(again.Jobs) != 2 {
			t.Fatalf("the workflow sent again = %+v, %v; want workflow %s with its 2 jobs", again, err, id)
		}
	})
}

// TestWorkflowCancelAndRetryCutOffByTheConnectionAreOutcomeUnknown: a workflow's
// cancel, or its retry, whose NATS connection closes after the coordinator took it,
// before its answer came, may have been applied: its error says the outcome is unknown
// and names the workflow (OutcomeWorkflow), and here the cancel was applied and the
// retry's steps run. A cancel sent again is answered as the first; a retry sent again
// is not (it is refused while the steps it ran again run, and would run again those
// that failed by then), so its error does not say sending it again is safe. Each error
// was the connection's, "nats: connection closed", which reads as nothing done.
func TestWorkflowCancelAndRetryCutOffByTheConnectionAreOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s := jobbustest.Start(t)
	native := client.New(s.NC)
	ctx := context.Background()
	submit := func(t *testing.T) string {
		t.Helper()
		w := client.NewWorkflow("").
			Step("a", "SLEEP", map[string]int{"durationMillis": 60000}).
			Step("b", "SLEEP", map[string]int{"durationMillis": 1}).Chain("a", "b")
		sub, err := native.SubmitWorkflow(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		return sub.WorkflowID
	}
	unknown := func(t *testing.T, what string, err error, id string) {
		t.Helper()
		named, ok := client.OutcomeWorkflow(err)
		if !errors.Is(err, client.ErrOutcomeUnknown) || !ok || named != id {
			t.Fatalf("%s cut off before its answer = %v; want an error matching ErrOutcomeUnknown, naming workflow %s", what, err, id)
		}
	}

	t.Run("CancelWorkflow", func(t *testing.T) {
		id := submit(t)
		_, err := cutOffClient(t, s).CancelWorkflow(ctx, id)
		unknown(t, "CancelWorkflow", err, id)
		st, err := native.WorkflowStatus(ctx, id)
		if err != nil || st.Counts[protocol.StateCancelled] != 2 {
			t.Fatalf("workflow %s after the cut-off cancel: %+v, %v; want its 2 steps CANCELLED", id, st, err)
		}
		// Sent again, it is answered as the first.
		if n, err := native.CancelWorkflow(ctx, id); err != nil || n != 2 {
			t.Fatalf("the cancel sent again = %d, %v; want 2 steps cancelled", n, err)
		}
	})
	t.Run("RetryWorkflow", func(t *testing.T) {
		id := submit(t)
		if _, err := native.CancelWorkflow(ctx, id); err != nil {
			t.Fatal(err)
		}
		before, err := native.WaitWorkflow(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cutOffClient(t, s).RetryWorkflow(ctx, id)
		unknown(t, "RetryWorkflow", err, id)
		if strings.Contains(err.Error(), "again is safe") {
			t.Errorf("RetryWorkflow cut off = %v; a retry sent again is not safe", err)
		}
		after, err := native.WorkflowStatus(ctx, id)
		if err != nil || len(after.Steps) != 2 || after.Steps[0].JobID == before.Steps[0].JobID || after.Steps[0].State.Terminal() {
			t.Fatalf("workflow %s after the cut-off retry: %+v, %v; want step a run again as a new job (it was %+v)", id, after, err, before.Steps)
		}
		if _, err := native.RetryWorkflow(ctx, id); err == nil {
			t.Fatalf("the retry sent again while its steps run succeeded; want it refused")
		}
	})
}

// TestWritesEndedByTheirContextAfterTheyWentAreOutcomeUnknown: a cancel, a workflow's
// submission, its cancel or its retry whose caller's context ends after the request
// reached a coordinator, before its answer, may have been applied: like a submission,
// its error matches ErrOutcomeUnknown, naming its job (workflow), and wraps
// context.Canceled when the caller cancelled. It was the context's bare error, which
// reads as nothing done.
func TestWritesEndedByTheirContextAfterTheyWentAreOutcomeUnknown(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t, jobbustest.WithoutCoordinator())
	c := client.New(sys.NC, client.WithTimeout(time.Minute))
	for _, tc := range []struct {
		t     protocol.Type
		named func(error) (string, bool)
		send  func(ctx context.Context) error
	}{
		{protocol.TypeCancelJob, client.OutcomeJob, func(ctx context.Context) error {
			_, _, err := c.Cancel(ctx, "j1")
			return err
		}},
		{protocol.TypeSubmitWorkflow, client.OutcomeWorkflow, func(ctx context.Context) error {
			_, err := c.SubmitWorkflow(ctx, client.NewWorkflow("j1").Step("a", "SHA256", map[string]string{"text": "x"}))
			return err
		}},
		{protocol.TypeCancelWorkflow, client.OutcomeWorkflow, func(ctx context.Context) error {
			_, err := c.CancelWorkflow(ctx, "j1")
			return err
		}},
		{protocol.TypeRetryWorkflow, client.OutcomeWorkflow, func(ctx context.Context) error {
			_, err := c.RetryWorkflow(ctx, "j1")
			return err
		}},
	} {
		e, _ := protocol.EndpointFor(tc.t)
		t.Run(string(tc.t)+"/cancelled", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// A coordinator that takes the request and has not answered when the
			// caller gives up.
			sub, err := sys.NC.Subscribe(e.Subject(), func(*nats.Msg) { cancel() })
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			err = tc.send(ctx)
			id, ok := tc.named(err)
			if !errors.Is(err, client.ErrOutcomeUnknown) || !ok || id != "j1" || !errors.Is(err, context.Canceled) {
				t.Fatalf("%s cancelled after it went = %v; want an unknown outcome naming j1, and context.Canceled", tc.t, err)
			}
		})
		t.Run(string(tc.t)+"/deadline", func(t *testing.T) {
			sub, err := sys.NC.Subscribe(e.Subject(), func(*nats.Msg) {}) // takes it, never answers
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			err = tc.send(ctx)
			if id, ok := tc.named(err); !errors.Is(err, client.ErrOutcomeUnknown) || !ok || id != "j1" {
				t.Fatalf("%s unanswered at its deadline = %v; want an unknown outcome naming j1", tc.t, err)
			}
		})
	}
}
