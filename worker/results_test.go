package worker_test

import (
	"fmt"
	"testing"

	"github.com/jobbus/jobbus/worker/tasks"
)

// TestResultsWithoutBatchPath: the coordinator's registration said it takes batches of
// results, but the one that answers has no handler for them (an older coordinator
// leads now). Every result is still delivered, on its own, as to an older
// coordinator, and each exactly once.
func TestResultsWithoutBatchPath(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{claimBatches: true, dropResults: 1})
	f.waitRegistered(t, 1)
	const n = 12
	for i := range n {
		f.coord.assign(t, f.w.ID(), fmt.Sprintf("job-%d", i), fmt.Sprintf("att-%d", i), tasks.TypeSHA256, `{"text":"abc"}`)
	}
	for i := range n {
		if r := f.coord.result(t, fmt.Sprintf("job-%d", i), fmt.Sprintf("att-%d", i)); !r.Success {
			t.Errorf("result %d = %+v", i, r)
		}
	}
	f.shutdown(t) // no goroutine left that could send one again
	for i := range n {
		if got := len(f.coord.resultsFor(fmt.Sprintf("job-%d", i), fmt.Sprintf("att-%d", i))); got != 1 {
			t.Errorf("result %d acknowledged %d times, want once", i, got)
		}
	}
	if f.logs.has("result not delivered") || f.logs.has("result refused") {
		t.Errorf("a result was not delivered: %v", f.logs.records)
	}
}
