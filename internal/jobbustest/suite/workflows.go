package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/testkit"
)

// workflows is the suite of dependencies, workflows and batches (issue 26).
var workflows = []struct {
	name string
	test func(t *testing.T, tr Transport)
}{
	{"AfterWaitsThenRuns", testAfterWaitsThenRuns},
	{"AfterFailedParentCancels", testAfterFailedParentCancels},
	{"AfterRefusals", testAfterRefusals},
	{"WorkflowFanOutFanIn", testWorkflowFanOutFanIn},
	{"WorkflowChain", testWorkflowChain},
	{"WorkflowRefusals", testWorkflowRefusals},
	{"WorkflowCancel", testWorkflowCancel},
	{"WorkflowRetry", testWorkflowRetry},
	{"WorkflowRestart", testWorkflowRestart},
	{"BatchCallbacks", testBatchCallbacks},
	{"BatchCallbackOnceAcrossRestart", testBatchCallbackOnceAcrossRestart},
	{"BatchCountsAcrossRestart", testBatchCountsAcrossRestart},
}

// RunWorkflows runs the workflow suite over tr, each test as a parallel subtest.
func RunWorkflows(t *testing.T, tr Transport) {
	t.Helper()
	for _, wt := range workflows {
		t.Run(wt.name, func(t *testing.T) {
			t.Parallel()
			wt.test(t, tr)
		})
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// SubmitWorkflow submits w, failing the test on an error.
func (s *System) SubmitWorkflow(w *client.Workflow) protocol.WorkflowSubmitted {
	s.t.Helper()
	out, err := s.Client.SubmitWorkflow(ctxT(s.t), w)
	if err != nil {
		s.t.Fatalf("submit workflow: %v", err)
	}
	return out
}

// WaitWorkflow waits until no step of workflow id is active.
func (s *System) WaitWorkflow(id string) protocol.WorkflowStatus {
	s.t.Helper()
	st, err := s.Client.WaitWorkflow(ctxT(s.t), id)
	if err != nil {
		s.t.Fatalf("wait workflow %s: %v", id, err)
	}
	return st
}

// StoredPayload reads job id's record from the jobs bucket once it is stored finished:
// its payload as stored. A status answers from the coordinator's memory, which may be
// a commit ahead of the store.
func (s *System) StoredPayload(id string) json.RawMessage {
	s.t.Helper()
	js, err := jetstream.New(s.NC)
	Must(s.t, err)
	kv, err := js.KeyValue(ctxT(s.t), protocol.JobsBucket)
	Must(s.t, err)
	var r protocol.Record
	testkit.Wait(s.t, 10*time.Second, func() error {
		e, err := kv.Get(ctxT(s.t), id)
		if err != nil {
			return err
		}
		r = protocol.Record{}
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			return err
		}
		if !r.State.Terminal() {
			return fmt.Errorf("job %s stored %s", id, r.State)
		}
		return nil
	})
	return r.Payload
}

func testAfterWaitsThenRuns(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	a := s.Submit("SHA256", Text("abc"))
	b := s.Submit("WORD_COUNT", Text("one two three"), client.After(a))
	if j := s.Status(b); j.State != protocol.StateWaiting || len(j.After) != 1 || j.After[0] != a {
		t.Fatalf("child %+v, want WAITING after %s while no worker runs its parent", j, a)
	}
	s.StartWorker(2)
	jb := s.Wait(b)
	ja := s.Status(a)
	if jb.State != protocol.StateCompleted || ja.State != protocol.StateCompleted {
		t.Fatalf("parent %s, child %s, want both COMPLETED", ja.State, jb.State)
	}
	if jb.CreatedAtMillis > 0 && jb.UpdatedAtMillis < ja.UpdatedAtMillis {
		t.Fatalf("child finished at %d, before its parent at %d", jb.UpdatedAtMillis, ja.UpdatedAtMillis)
	}
	if len(jb.Parents) != 1 || jb.Parents[0].JobID != a || jb.Parents[0].State != protocol.StateCompleted ||
		Deref(jb.Parents[0].Result) != Deref(ja.Result) {
		t.Fatalf("child's parents %+v, want %s COMPLETED with result %q", jb.Parents, a, Deref(ja.Result))
	}
}

func testAfterFailedParentCancels(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	a := s.Submit("FAIL", map[string]int{"failUntilAttempt": 5}, client.MaxAttempts(1))
	b := s.Submit("SHA256", Text("b"), client.After(a))
	c := s.Submit("SHA256", Text("c"), client.After(a), client.AfterAnyEnd())
	d := s.Submit("SHA256", Text("d"), client.After(b)) // cancelled in turn
	s.StartWorker(2)
	if j := s.Wait(a); j.State != protocol.StateFailed {
		t.Fatalf("parent %s, want FAILED", j.State)
	}
	jb := s.Wait(b)
	if want := "parent job " + a + " ended FAILED"; jb.State != protocol.StateCancelled || Deref(jb.Error) != want {
		t.Fatalf("child %s %q, want CANCELLED %q", jb.State, Deref(jb.Error), want)
	}
	if jd := s.Wait(d); jd.State != protocol.StateCancelled || !strings.Contains(Deref(jd.Error), b) {
		t.Fatalf("grandchild %s %q, want CANCELLED naming %s", jd.State, Deref(jd.Error), b)
	}
	if jc := s.Wait(c); jc.State != protocol.StateCompleted {
		t.Fatalf("afterAnyEnd child %s %q, want COMPLETED", jc.State, Deref(jc.Error))
	}
	// A job after an ended one: COMPLETED starts at once, FAILED is refused.
	done := s.Submit("SHA256", Text("x"))
	s.Wait(done)
	if j := s.Wait(s.Submit("SHA256", Text("y"), client.After(done))); j.State != protocol.StateCompleted {
		t.Fatalf("job after a completed one %s, want COMPLETED", j.State)
	}
	_, err := s.Client.Submit(ctxT(t), "SHA256", Text("z"), client.After(a))
	if err == nil || !strings.Contains(err.Error(), "parent job "+a+" ended FAILED") {
		t.Fatalf("submit after a failed job: %v, want a refusal naming it", err)
	}
}

func testAfterRefusals(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	_, err := s.Client.Submit(ctxT(t), "SHA256", Text("x"), client.After("0b5b7d4c-1111-4111-8111-111111111111"))
	if err == nil || !strings.Contains(err.Error(), "Unknown parent job: 0b5b7d4c-1111-4111-8111-111111111111") {
		t.Fatalf("submit after an unknown job: %v, want Unknown parent job", err)
	}
	if page, err := s.Client.List(ctxT(t), protocol.ListJobs{}); err != nil || len(page.Jobs) != 0 {
		t.Fatalf("a refused submission created jobs: %v %v", page.Jobs, err)
	}
}

func testWorkflowFanOutFanIn(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	s.StartWorker(4)
	const n = 20
	w := client.NewWorkflow("fan").Step("split", "SHA256", Text("in"))
	var branches []string
	for i := range n {
		name := fmt.Sprintf("b%d", i)
		branches = append(branches, name)
		w.Step(name, "WORD_COUNT", Text(strings.Repeat("w ", i+1)), client.StepAfter("split"))
	}
	w.Step("join", "SHA256", Text("out"), client.StepAfter(branches...))
	sub := s.SubmitWorkflow(w)
	if sub.WorkflowID != "fan" || len(sub.Jobs) != n+2 {
		t.Fatalf("submitted %+v, want workflow fan with %d jobs", sub, n+2)
	}
	st := s.WaitWorkflow("fan")
	if st.State != string(protocol.StateCompleted) || st.Counts[protocol.StateCompleted] != n+2 || len(st.Steps) != n+2 {
		t.Fatalf("workflow %s counts %v, want all %d COMPLETED", st.State, st.Counts, n+2)
	}
	join := s.Status(sub.Jobs["join"])
	if join.WorkflowID != "fan" || join.Step != "join" || len(join.Parents) != n {
		t.Fatalf("join %+v, want step join of fan with %d parents", join, n)
	}
	for _, p := range join.Parents {
		pj := s.Status(p.JobID)
		if p.State != protocol.StateCompleted || join.UpdatedAtMillis < pj.UpdatedAtMillis {
			t.Fatalf("join ended at %d, parent %s (%s) at %d", join.UpdatedAtMillis, p.Step, p.State, pj.UpdatedAtMillis)
		}
	}
	// The same workflow again is answered as the first time; another under its id is refused.
	if again := s.SubmitWorkflow(w); again.Jobs["join"] != sub.Jobs["join"] {
		t.Fatalf("resubmitted %+v, want the same jobs", again)
	}
	_, err := s.Client.SubmitWorkflow(ctxT(t), client.NewWorkflow("fan").Step("x", "SHA256", Text("x")))
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("another workflow under an id in use: %v, want refused", err)
	}
}

func testWorkflowChain(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	s.StartWorker(4)
	w := client.NewWorkflow("").Step("a", "SHA256", Text("a")).Step("b", "SHA256", Text("b")).Step("c", "SHA256", Text("c")).Chain("a", "b", "c")
	sub := s.SubmitWorkflow(w)
	st := s.WaitWorkflow(sub.WorkflowID)
	if st.State != string(protocol.StateCompleted) {
		t.Fatalf("chain %+v, want COMPLETED", st)
	}
	a, b, c := s.Status(sub.Jobs["a"]), s.Status(sub.Jobs["b"]), s.Status(sub.Jobs["c"])
	if !(a.UpdatedAtMillis <= b.UpdatedAtMillis && b.UpdatedAtMillis <= c.UpdatedAtMillis) || len(c.After) != 1 || c.After[0] != b.JobID {
		t.Fatalf("chain ran out of order: a %d, b %d, c %d (c after %v)", a.UpdatedAtMillis, b.UpdatedAtMillis, c.UpdatedAtMillis, c.After)
	}
	if got := st.Steps[2].After; len(got) != 1 || got[0] != "b" {
		t.Fatalf("status says c is after %v, want [b]", got)
	}
}

func testWorkflowRefusals(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	big := client.NewWorkflow("big")
	for i := range protocol.MaxWorkflowSteps + 1 {
		big.Step(fmt.Sprintf("s%d", i), "SHA256", json.RawMessage(`{"text":""}`))
	}
	cases := []struct {
		name string
		w    *client.Workflow
		want string
	}{
		{"cycle", client.NewWorkflow("cyc").Step("a", "SHA256", Text("a"), client.StepAfter("c")).
			Step("b", "SHA256", Text("b"), client.StepAfter("a")).Step("c", "SHA256", Text("c"), client.StepAfter("b")),
			"Invalid workflow: step a is on a cycle"},
		{"self", client.NewWorkflow("self").Step("a", "SHA256", Text("a"), client.StepAfter("a")), "Invalid workflow: step a waits for itself"},
		{"unknown step", client.NewWorkflow("unk").Step("a", "SHA256", Text("a"), client.StepAfter("nope")),
			`Invalid workflow: step a's after names unknown step "nope"`},
		{"unknown edge", client.NewWorkflow("edge").Step("a", "SHA256", Text("a")).Edge("a", "zz"),
			`Invalid workflow: edge 1 [a -> zz] names unknown step "zz"`},
		// A chain of one name orders nothing, so its name went unchecked: a chain written
		// with the wrong arrow ("a => b", read as one name) ran its steps at once.
		{"chain of one unknown name", client.NewWorkflow("arrow").Step("a", "SHA256", Text("a")).Step("b", "SHA256", Text("b")).Chain("a => b"),
			`Invalid workflow: chain position 1 names unknown step "a => b"`},
		{"chain starting unknown", client.NewWorkflow("chz").Step("a", "SHA256", Text("a")).Chain("zz", "a"),
			`Invalid workflow: chain position 1 names unknown step "zz"`},
		{"bad payload", client.NewWorkflow("pay").Step("a", "SHA256", Text("a")).Step("slow", "SLEEP", map[string]any{"durationMillis": "5"}),
			"Invalid workflow: step slow: Invalid payload: Field 'durationMillis' must be an integer"},
		{"unknown type", client.NewWorkflow("typ").Step("a", "NOPE", Text("a")), "Invalid workflow: step a: Unknown task type: NOPE"},
		{"duplicate", client.NewWorkflow("dup").Step("a", "SHA256", Text("a")).Step("a", "SHA256", Text("b")), "Invalid workflow: step a is named twice"},
		{"bad name", client.NewWorkflow("nm").Step("a b", "SHA256", Text("a")), `Invalid workflow: step 1: step name "a b"`},
		{"too many", big, fmt.Sprintf("Invalid workflow: %d steps; at most %d", protocol.MaxWorkflowSteps+1, protocol.MaxWorkflowSteps)},
	}
	for _, tc := range cases {
		_, err := s.Client.SubmitWorkflow(ctxT(t), tc.w)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if page, err := s.Client.List(ctxT(t), protocol.ListJobs{}); err != nil || len(page.Jobs) != 0 {
		t.Fatalf("refused workflows created jobs: %d %v", len(page.Jobs), err)
	}
	if _, err := s.Client.WorkflowStatus(ctxT(t), "cyc"); err == nil || !strings.Contains(err.Error(), "Unknown workflow: cyc") {
		t.Fatalf("status of a refused workflow: %v, want Unknown workflow", err)
	}
}

func testWorkflowCancel(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	s.StartWorker(2)
	w := client.NewWorkflow("stop").Step("a", "SLEEP", map[string]int{"durationMillis": 60000}).
		Step("b", "SHA256", Text("b")).Step("c", "SHA256", Text("c")).Chain("a", "b", "c")
	sub := s.SubmitWorkflow(w)
	s.WaitState(sub.Jobs["a"], protocol.StateRunning)
	n, err := s.Client.CancelWorkflow(ctxT(t), "stop")
	if err != nil || n != 3 {
		t.Fatalf("cancel: %d %v, want 3 steps cancelled", n, err)
	}
	st := s.WaitWorkflow("stop")
	for _, step := range st.Steps {
		if step.State != protocol.StateCancelled || Deref(step.Error) != "workflow stop cancelled by client request" {
			t.Fatalf("step %s %s %q, want CANCELLED by the workflow's cancel", step.Name, step.State, Deref(step.Error))
		}
	}
	if n, err := s.Client.CancelWorkflow(ctxT(t), "stop"); err != nil || n != 3 {
		t.Fatalf("cancel again: %d %v, want the same answer, 3", n, err)
	}
}

func testWorkflowRetry(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	s.StartWorker(2)
	w := client.NewWorkflow("again").Step("ok", "SHA256", Text("a")).
		Step("bad", "FAIL", map[string]int{"failUntilAttempt": 2}, client.StepMaxAttempts(1)).
		Step("last", "SHA256", Text("c")).Chain("ok", "bad", "last")
	sub := s.SubmitWorkflow(w)
	st := s.WaitWorkflow("again")
	if st.State != string(protocol.StateFailed) || st.Steps[2].State != protocol.StateCancelled {
		t.Fatalf("workflow %s, last step %s, want FAILED and CANCELLED", st.State, st.Steps[2].State)
	}
	jobs, err := s.Client.RetryWorkflow(ctxT(t), "again")
	if err != nil || len(jobs) != 2 || jobs["bad"] == "" || jobs["bad"] == sub.Jobs["bad"] || jobs["last"] == sub.Jobs["last"] {
		t.Fatalf("retry: %v %v, want new jobs for bad and last", jobs, err)
	}
	st = s.WaitWorkflow("again")
	if st.Steps[0].JobID != sub.Jobs["ok"] || st.Steps[1].JobID != jobs["bad"] || st.Steps[1].State != protocol.StateFailed {
		t.Fatalf("after retry %+v, want ok kept and bad run again (and failing again on its one attempt)", st.Steps)
	}
	if old := s.Status(sub.Jobs["bad"]); old.State != protocol.StateFailed {
		t.Fatalf("the first job of bad is %s, want it kept FAILED", old.State)
	}
}

func testWorkflowRestart(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	w := client.NewWorkflow("across").Step("a", "SLEEP", map[string]int{"durationMillis": 300}).
		Step("b", "SHA256", Text("b")).Step("c", "SHA256", Text("c")).Step("d", "SHA256", Text("d")).
		Edge("a", "b").Edge("a", "c").Edge("b", "d").Edge("c", "d")
	sub := s.SubmitWorkflow(w)
	s.RestartCoordinator(t)
	if j := s.Status(sub.Jobs["d"]); j.State != protocol.StateWaiting {
		t.Fatalf("after restart d is %s, want WAITING", j.State)
	}
	s.StartWorker(2)
	s.WaitState(sub.Jobs["b"], protocol.StateCompleted)
	s.RestartCoordinator(t)
	if st := s.WaitWorkflow("across"); st.State != string(protocol.StateCompleted) {
		t.Fatalf("workflow after restarts %+v, want COMPLETED", st)
	}
}

func testBatchCallbacks(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	s.StartWorker(4)
	b := client.NewBatch("nightly")
	for i := range 5 {
		b.Step("", "SHA256", Text(fmt.Sprint(i)))
	}
	b.Step("", "FAIL", map[string]int{"failUntilAttempt": 9}, client.StepMaxAttempts(1))
	b.OnSuccess("SHA256", Text("all good")).OnComplete("SHA256", map[string]any{"text": "report"})
	sub := s.SubmitWorkflow(b)
	st := s.WaitWorkflow("nightly")
	if st.Kind != protocol.KindBatch || st.Counts[protocol.StateCompleted] != 6 || st.Counts[protocol.StateFailed] != 1 || st.Counts[protocol.StateCancelled] != 1 {
		t.Fatalf("batch %+v, want 5 jobs and on-complete COMPLETED, 1 FAILED, on-success CANCELLED", st.Counts)
	}
	succ := s.Status(sub.Jobs[protocol.StepOnSuccess])
	if succ.State != protocol.StateCancelled || succ.BatchID != "nightly" {
		t.Fatalf("on-success %s, want CANCELLED (a job failed)", succ.State)
	}
	comp := s.Status(sub.Jobs[protocol.StepOnComplete])
	if comp.State != protocol.StateCompleted || comp.Attempts != 1 {
		t.Fatalf("on-complete %s after %d attempts, want COMPLETED once", comp.State, comp.Attempts)
	}
	var p struct {
		Text  string         `json:"text"`
		Batch map[string]any `json:"batch"`
	}
	Must(t, json.Unmarshal(s.StoredPayload(comp.JobID), &p))
	if p.Text != "report" || p.Batch["batchId"] != "nightly" || p.Batch["total"] != 6.0 || p.Batch["completed"] != 5.0 || p.Batch["failed"] != 1.0 {
		t.Fatalf("on-complete payload %+v, want its text and the counts 6 total, 5 completed, 1 failed", p)
	}
}

// testBatchCallbackOnceAcrossRestart: the coordinator restarts right after the last
// job of a batch completed; its on-success callback runs once, neither twice nor never.
func testBatchCallbackOnceAcrossRestart(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	m := s.tr.Peer(s, "manual")
	m.RegisterServing(4, protocol.Named("SHA256")) // not the callback's type: it waits for the restart
	b := client.NewBatch("once").Step("j1", "SHA256", Text("1")).Step("j2", "SHA256", Text("2")).OnSuccess("WORD_COUNT", Text("done"))
	sub := s.SubmitWorkflow(b)
	for range 2 {
		s.Accept(m, s.NextAssign(m), true, "ok")
	}
	s.RestartCoordinator(t)
	fresh := s.ManualWorker("fresh", 4)
	cb := s.NextAssign(fresh)
	if cb.JobID != sub.Jobs[protocol.StepOnSuccess] || cb.AttemptNumber != 1 {
		t.Fatalf("assigned %+v, want the on-success callback's first attempt", cb)
	}
	s.Accept(fresh, cb, true, "fired")
	st := s.WaitWorkflow("once")
	if st.State != string(protocol.StateCompleted) || len(st.Steps) != 3 {
		t.Fatalf("batch %+v, want COMPLETED with one callback", st)
	}
	if j := s.Status(cb.JobID); j.Attempts != 1 || Deref(j.Result) != "fired" {
		t.Fatalf("callback %+v, want one attempt", j)
	}
}

// testBatchCountsAcrossRestart: the coordinator restarts after one job of a batch
// ended and before the other did; the on-complete callback's counts still count both.
func testBatchCountsAcrossRestart(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	m := s.tr.Peer(s, "manual")
	m.RegisterServing(4, protocol.Named("SHA256")) // not the other job's type: it waits for the restart
	b := client.NewBatch("counts").Step("j1", "SHA256", Text("1")).Step("j2", "WORD_COUNT", Text("a b")).
		OnComplete("WORD_COUNT", Text("report"))
	sub := s.SubmitWorkflow(b)
	s.Accept(m, s.NextAssign(m), true, "ok")
	s.RestartCoordinator(t)
	s.StartWorker(2)
	st := s.WaitWorkflow("counts")
	if st.State != string(protocol.StateCompleted) || st.Counts[protocol.StateCompleted] != 3 {
		t.Fatalf("batch %s %v, want its 2 jobs and on-complete COMPLETED", st.State, st.Counts)
	}
	var p struct {
		Batch map[string]any `json:"batch"`
	}
	Must(t, json.Unmarshal(s.StoredPayload(sub.Jobs[protocol.StepOnComplete]), &p))
	if p.Batch["total"] != 2.0 || p.Batch["completed"] != 2.0 || p.Batch["failed"] != 0.0 || p.Batch["cancelled"] != 0.0 {
		t.Fatalf("on-complete counts %v, want 2 total, 2 completed", p.Batch)
	}
}
