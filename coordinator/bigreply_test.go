package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest/suite"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tasks"
)

// TestStatusWithManyLargeParents: a job after 20 parents, each COMPLETED with a result
// of about 60 KiB, has a status whose parents' results alone exceed a NATS message. It
// is answered at once, over the Go client and over the bridge's TCP client port, with
// the job whole and as many parents' results as fit; the others are cut, marked so.
func TestStatusWithManyLargeParents(t *testing.T) {
	t.Parallel()
	sb := suite.Setup(t, suite.TCPClientNativeWorkers)
	w := sb.ManualWorker("w1", 1)
	const parents = 20
	big := strings.Repeat("r", 60<<10)
	var ids []string
	for i := range parents {
		id := sb.Submit("SHA256", text(fmt.Sprint(i)))
		a := sb.NextAssign(w)
		if a.JobID != id {
			t.Fatalf("assignment %s, want %s", a.JobID, id)
		}
		sb.Accept(w, a, true, fmt.Sprintf("%02d%s", i, big))
		ids = append(ids, id)
	}
	child := sb.Submit("SHA256", text("child"), client.After(ids...))

	for _, by := range []struct {
		name string
		c    *client.Client
	}{{"native", client.New(sb.NC, client.WithTimeout(2*time.Second))}, {"tcp", sb.Client}} {
		name, c := by.name, by.c
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		start := time.Now()
		j, err := c.Status(ctx, child)
		cancel()
		if err != nil {
			t.Errorf("%s: status of a job after %d parents of 60 KiB results: %v (after %v)", name, parents, err, time.Since(start))
			continue
		}
		if j.JobID != child || j.State != protocol.StateQueued && j.State != protocol.StateRunning || len(j.After) != parents {
			t.Errorf("%s: status %s %s after %d, want %s QUEUED or RUNNING after %d", name, j.JobID, j.State, len(j.After), child, parents)
		}
		if len(j.Parents) != parents {
			t.Errorf("%s: %d parents, want %d", name, len(j.Parents), parents)
			continue
		}
		whole, cut := 0, 0
		for i, p := range j.Parents {
			if p.JobID != ids[i] || p.State != protocol.StateCompleted {
				t.Errorf("%s: parent %d is %s %s, want %s COMPLETED", name, i, p.JobID, p.State, ids[i])
			}
			switch r := suite.Deref(p.Result); {
			case r == fmt.Sprintf("%02d%s", i, big):
				whole++
			case p.Result == nil && p.ResultOmitted:
				cut++
			default:
				t.Errorf("%s: parent %d's result is %d bytes, neither whole nor marked cut", name, i, len(r))
			}
		}
		if whole == 0 || cut == 0 {
			t.Errorf("%s: %d parents' results whole, %d cut, want some of each", name, whole, cut)
		}
	}
}

// TestStatusLargerThanAMessageIsRefusedAtOnce: a workflow's join step after 9,999
// others has a status (its after list and its parents, without results) larger than a
// NATS message, whatever is left out of it. It is answered at once, over the Go client
// and over the bridge's TCP client port, with an ERROR that says so, not left for the
// caller's timeout.
func TestStatusLargerThanAMessageIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	s := suite.Setup(t, suite.TCPClientNativeWorkers)
	const steps = protocol.MaxWorkflowSteps - 1
	w := client.NewWorkflow("wide")
	names := make([]string, steps)
	for i := range names {
		names[i] = fmt.Sprintf("p%04d", i)
		w.Step(names[i], "SHA256", text(""))
	}
	w.Step("join", "SHA256", text(""), client.StepAfter(names...))
	nc := client.New(s.NC, client.WithTimeout(3*time.Second))
	// 10,000 jobs in one atomic batch take a while under -race.
	sub, err := client.New(s.NC, client.WithTimeout(30*time.Second)).SubmitWorkflow(context.Background(), w)
	if err != nil {
		t.Fatalf("submit a workflow of %d steps: %v", steps+1, err)
	}
	join := sub.Jobs["join"]

	for _, by := range []struct {
		name string
		c    *client.Client
	}{{"native", nc}, {"tcp", s.Client}} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		start := time.Now()
		_, err := by.c.Status(ctx, join)
		cancel()
		took := time.Since(start)
		t.Logf("%s: %v after %v", by.name, err, took)
		if err == nil || !strings.Contains(err.Error(), protocol.ReplyTooLargePrefix) || took > time.Second {
			t.Errorf("%s: status of a job after %d parents: %v after %v, want at once an ERROR Reply too large", by.name, steps, err, took)
		}
	}
}

// TestWriteWithReplyLargerThanAMessageSaysItWasDone: a workflow of 10,000 steps of
// 64-character names and empty payloads fits in a request, but its WORKFLOW_SUBMITTED
// (each name and its job id) does not fit in a NATS message. It is stored, and the
// submission is answered at once "Outcome unknown: the request was carried out, but
// its reply is too large", never an ERROR that would mean nothing was stored.
func TestWriteWithReplyLargerThanAMessageSaysItWasDone(t *testing.T) {
	t.Parallel()
	s := suite.Setup(t, suite.Native)
	s.ManualWorker("w1", 1).RegisterServing(1, protocol.TaskTypeDecl{Name: "T"})
	w := client.NewWorkflow("wide")
	for i := range protocol.MaxWorkflowSteps {
		w.Step(fmt.Sprintf("%064d", i), "T", suite.RawJSON("{}"))
	}
	req, err := w.Request()
	must(t, err)
	c := client.New(s.NC, client.WithTimeout(20*time.Second))
	start := time.Now()
	_, err = c.SubmitWorkflowRequest(context.Background(), req)
	took := time.Since(start)
	t.Logf("%v after %v", err, took)
	if !errors.Is(err, client.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "reply is too large") {
		t.Fatalf("submit a workflow whose answer exceeds a message: %v after %v, want Outcome unknown ... reply is too large", err, took)
	}
	st, err := c.WorkflowStatus(context.Background(), "wide")
	must(t, err)
	if n := st.Counts[protocol.StateQueued] + st.Counts[protocol.StateRunning]; n != protocol.MaxWorkflowSteps {
		t.Fatalf("workflow %s counts %v, want its %d steps stored", st.State, st.Counts, protocol.MaxWorkflowSteps)
	}
}

// TestParentResultsInHandlerOfLargeResults: a step after 20 parents, each of which
// returned a result of 60 KiB, reads every parent's result whole with
// worker.ParentResults, though its status cannot hold them all.
func TestParentResultsInHandlerOfLargeResults(t *testing.T) {
	t.Parallel()
	s := setup(t)
	big := strings.Repeat("r", 60<<10)
	s.StartFunctionWorker(t, func(w *worker.Worker) error {
		return errors.Join(
			w.Handle("BIG", func(_ context.Context, _ int, p json.RawMessage) (string, error) {
				return string(p) + big, nil
			}),
			w.Handle("JOIN", func(ctx context.Context, _ int, _ json.RawMessage) (string, error) {
				ps, err := worker.ParentResults(ctx)
				if err != nil {
					return "", err
				}
				whole := 0
				for _, p := range ps {
					if r := deref(p.Result); strings.HasSuffix(r, big) && strings.HasPrefix(r, `{"n":"`+p.Step+`"}`) {
						whole++
					}
				}
				return fmt.Sprintf("%d of %d whole", whole, len(ps)), nil
			}))
	}, worker.WithTasks(tasks.NewRegistry()), worker.WithID("big"))
	s.Eventually("big registered", func() bool { return s.HasWorker("big") })
	const parents = 20
	w := client.NewWorkflow("bigparents")
	var names []string
	for i := range parents {
		name := fmt.Sprintf("p%02d", i)
		names = append(names, name)
		w.Step(name, "BIG", map[string]string{"n": name})
	}
	w.Step("j", "JOIN", rawJSON(`{}`), client.StepAfter(names...))
	sub := s.SubmitWorkflow(w)
	want := fmt.Sprintf("%d of %d whole", parents, parents)
	if j := s.Wait(sub.Jobs["j"]); j.State != protocol.StateCompleted || deref(j.Result) != want {
		t.Fatalf("join %s %q %q, want %q", j.State, deref(j.Result), deref(j.Error), want)
	}
}
