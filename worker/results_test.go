package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
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

// TestWorkerTakesAssignmentBatches: the worker says in its registration that it takes
// batches of assignments, and runs each assignment of a batch (task.assigns) as it
// would one sent alone: every one reports its result once, a duplicate in the batch
// is ignored, and a single assignment (an older coordinator's) still runs.
func TestWorkerTakesAssignmentBatches(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{})
	f.waitRegistered(t, 1)
	if reg := f.coord.registered()[0]; reg.Assigns != protocol.MaxAssigns {
		t.Fatalf("registration says it takes %d assignments a batch, want %d", reg.Assigns, protocol.MaxAssigns)
	}
	const n = 6
	batch := protocol.TaskAssigns{}
	for i := range n {
		batch.Assigns = append(batch.Assigns, protocol.TaskAssign{JobID: fmt.Sprintf("job-%d", i), AttemptID: fmt.Sprintf("att-%d", i),
			AttemptNumber: 1, TaskType: tasks.TypeSHA256, Payload: json.RawMessage(`{"text":"abc"}`)})
	}
	batch.Assigns = append(batch.Assigns, batch.Assigns[0]) // a duplicate: ignored
	if err := f.coord.node.Tell(context.Background(), bus.Address{Role: bus.RoleWorker, ID: f.w.ID()}, protocol.PathAssigns, &batch); err != nil {
		t.Fatal(err)
	}
	f.coord.assign(t, f.w.ID(), "job-single", "att-single", tasks.TypeSHA256, `{"text":"abc"}`)
	for i := range n {
		if r := f.coord.result(t, fmt.Sprintf("job-%d", i), fmt.Sprintf("att-%d", i)); !r.Success {
			t.Errorf("result %d = %+v", i, r)
		}
	}
	if r := f.coord.result(t, "job-single", "att-single"); !r.Success {
		t.Errorf("single assignment's result = %+v", r)
	}
	f.shutdown(t)
	for i := range n {
		if got := len(f.coord.resultsFor(fmt.Sprintf("job-%d", i), fmt.Sprintf("att-%d", i))); got != 1 {
			t.Errorf("result %d reported %d times, want once", i, got)
		}
	}
}
