package client

import (
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

func TestRecordSnapshot(t *testing.T) {
	t.Parallel()
	// A coordinator record: internal fields beside the snapshot's, workerId kept after the run.
	rec := `{"jobId":"j1","taskType":"SHA256","payload":{"text":"x"},"state":"COMPLETED","attempts":1,"maxAttempts":3,
		"priority":"HIGH","seq":7,"workerId":"worker-1","attemptId":"a1","result":"abc","createdAtMillis":5,"updatedAtMillis":6,"fingerprint":"f"}`
	j, err := recordSnapshot([]byte(rec))
	if err != nil {
		t.Fatal(err)
	}
	want := protocol.Job{JobID: "j1", TaskType: "SHA256", State: protocol.StateCompleted, Attempts: 1, MaxAttempts: 3,
		Result: str("abc"), CreatedAtMillis: 5, UpdatedAtMillis: 6, Priority: protocol.PriorityHigh}
	if j.WorkerID != nil || *j.Result != "abc" || j.JobID != want.JobID || j.State != want.State || j.Priority != want.Priority ||
		j.Attempts != 1 || j.MaxAttempts != 3 || j.CreatedAtMillis != 5 || j.UpdatedAtMillis != 6 || j.Error != nil {
		t.Errorf("got %+v, want %+v", j, want)
	}
	running, err := recordSnapshot([]byte(`{"jobId":"j2","state":"RUNNING","workerId":"worker-2"}`))
	if err != nil || running.WorkerID == nil || *running.WorkerID != "worker-2" || running.Priority != protocol.PriorityNormal {
		t.Errorf("running record: %+v, %v", running, err)
	}
}

func TestJobTracker(t *testing.T) {
	t.Parallel()
	seen := jobTracker{}
	j := protocol.Job{JobID: "j", State: protocol.StateQueued}
	if !seen.changed(j) {
		t.Error("first sight is a change")
	}
	j.UpdatedAtMillis = 99 // rewritten, nothing shown changed
	if seen.changed(j) {
		t.Error("same state, attempts and worker is no change")
	}
	j.State, j.Attempts, j.WorkerID = protocol.StateRunning, 1, str("w")
	if !seen.changed(j) {
		t.Error("running is a change")
	}
}

func TestJobTrackerUpdate(t *testing.T) {
	t.Parallel()
	seen := jobTracker{}
	a := protocol.Job{JobID: "a", State: protocol.StateCompleted}
	b := protocol.Job{JobID: "b", State: protocol.StateQueued}
	if got := seen.update([]protocol.Job{b, a}); len(got) != 2 || got[0].JobID != "a" || got[1].JobID != "b" {
		t.Errorf("first list: %+v, want a and b, oldest first", got)
	}
	b.State = protocol.StateRunning
	if got := seen.update([]protocol.Job{b}); len(got) != 1 || got[0].JobID != "b" {
		t.Errorf("b running, a gone: %+v, want b alone", got)
	}
	if _, kept := seen["a"]; kept || len(seen) != 1 {
		t.Errorf("a job no longer listed is still tracked: %v", seen)
	}
}

func str(s string) *string { return &s }
