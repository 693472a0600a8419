package metrics_test

import (
	"context"
	"testing"

	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestWorkflowCounters: a workflow that completes and one that fails each move
// workflows_total once on start and once on end; a batch counts under its kind.
func TestWorkflowCounters(t *testing.T) {
	t.Parallel()
	s := start(t)
	s.worker(t)
	ok := client.NewWorkflow("ok").Step("a", "SHA256", map[string]string{"text": "a"}).Step("b", "SHA256", map[string]string{"text": "b"}).Chain("a", "b")
	bad := client.NewWorkflow("bad").Step("a", "FAIL", map[string]int{"failUntilAttempt": 9}, client.StepMaxAttempts(1)).Step("b", "SHA256", map[string]string{"text": "b"}).Chain("a", "b")
	batch := client.NewBatch("b1").Step("", "SHA256", map[string]string{"text": "x"}).OnComplete("SHA256", map[string]string{"text": "done"})
	for _, w := range []*client.Workflow{ok, bad, batch} {
		if _, err := s.cl.SubmitWorkflow(context.Background(), w); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]float64{
		`jobbus_workflows_total{event="started",kind="workflow"}`:   2,
		`jobbus_workflows_total{event="completed",kind="workflow"}`: 1,
		`jobbus_workflows_total{event="failed",kind="workflow"}`:    1,
		`jobbus_workflows_total{event="started",kind="batch"}`:      1,
		`jobbus_workflows_total{event="completed",kind="batch"}`:    1,
	}
	testkit.Eventually(t, waitFor, "workflow counters", func() bool {
		got := scrape(t, s.url)
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	})
}
