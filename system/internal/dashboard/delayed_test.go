package dashboard_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
)

// TestScheduledJobsShowTheirDueTime: the SCHEDULED filter lists a delayed job with its
// due time, and a snoozed job's history shows the snooze, with its due time and count.
func TestScheduledJobsShowTheirDueTime(t *testing.T) {
	t.Parallel()
	s := start(t, false, nil)
	later := s.submit(t, "SHA256", map[string]string{"text": "later"}, client.RunIn(time.Hour))
	var p struct {
		Jobs []struct {
			JobID string         `json:"jobId"`
			State protocol.State `json:"state"`
			RunAt int64          `json:"runAtMillis"`
		} `json:"jobs"`
	}
	testkit.Eventually(t, waitFor, "the SCHEDULED job listed", func() bool {
		getJSON(t, s.url+"/api/jobs?state=SCHEDULED", &p)
		return len(p.Jobs) == 1
	})
	st, err := s.cl.Status(context.Background(), later)
	if err != nil {
		t.Fatal(err)
	}
	if j := p.Jobs[0]; j.JobID != later || j.State != protocol.StateScheduled || j.RunAt != st.RunAtMillis || j.RunAt == 0 {
		t.Fatalf("listed %+v, want job %s SCHEDULED due %d", j, later, st.RunAtMillis)
	}

	var polls atomic.Int32
	s.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("POLL", func(context.Context, int, json.RawMessage) (string, error) {
			if polls.Add(1) == 1 {
				return "", worker.Snooze(200 * time.Millisecond)
			}
			return "ready", nil
		})
	})
	testkit.Eventually(t, waitFor, "POLL served", func() bool {
		types, err := s.cl.TaskTypes(context.Background())
		for _, tt := range types {
			if tt.Name == "POLL" && len(tt.Workers) > 0 {
				return err == nil
			}
		}
		return false
	})
	id := s.submit(t, "POLL", map[string]any{}, client.MaxAttempts(1))
	var d struct {
		State    protocol.State `json:"state"`
		Attempts int            `json:"attempts"`
		Snoozes  int            `json:"snoozes"`
		History  []struct {
			State    protocol.State `json:"state"`
			Attempts int            `json:"attempts"`
			RunAt    int64          `json:"runAtMillis"`
			Snoozes  int            `json:"snoozes"`
		} `json:"history"`
	}
	testkit.Eventually(t, waitFor, "the snoozed job completed, its history seen", func() bool {
		d.History = nil
		getJSON(t, s.url+"/api/jobs/"+id, &d)
		n := len(d.History)
		return d.State == protocol.StateCompleted && n > 0 && d.History[n-1].State == protocol.StateCompleted
	})
	if d.Attempts != 1 || d.Snoozes != 1 {
		t.Fatalf("detail: attempts %d, snoozes %d; want 1 and 1", d.Attempts, d.Snoozes)
	}
	snoozed := false
	for _, h := range d.History {
		snoozed = snoozed || h.State == protocol.StateScheduled && h.Snoozes == 1 && h.RunAt != 0 && h.Attempts == 0
	}
	if !snoozed {
		t.Fatalf("history shows no snooze: %+v", d.History)
	}
}
