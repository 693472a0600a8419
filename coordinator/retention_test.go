package coordinator_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
)

// retention is the shortest JetStream allows: finished jobs go within seconds.
func withRetention(d time.Duration) func(*coordinator.Config) {
	return func(c *coordinator.Config) { c.Retention = d }
}

// gone reports whether the coordinator answers Unknown job for id.
func gone(s *system, id string) bool {
	_, err := s.Client.Status(context.Background(), id)
	if err != nil && !strings.Contains(err.Error(), "Unknown job: "+id) {
		s.T().Fatalf("status %s: %v", id, err)
	}
	return err != nil
}

// listed reports whether a full list shows id.
func listed(s *system, id string) bool {
	for _, j := range listAll(s, protocol.ListJobs{Limit: 3}) {
		if j.JobID == id {
			return true
		}
	}
	return false
}

// listAll pages through the list with req's limit.
func listAll(s *system, req protocol.ListJobs) []protocol.Job {
	s.T().Helper()
	var all []protocol.Job
	for {
		page, err := s.Client.List(context.Background(), req)
		if err != nil {
			s.T().Fatal(err)
		}
		all = append(all, page.Jobs...)
		if page.NextCursor == "" {
			return all
		}
		req.Cursor = page.NextCursor
	}
}

// TestFinishedJobsExpire: a COMPLETED, FAILED or CANCELLED job, and its idempotency key,
// are gone once the retention after its end has passed; an active job never expires.
func TestFinishedJobsExpire(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		finish func(s *system, key string) string
		want   protocol.State
	}{
		{"Completed", func(s *system, key string) string {
			return s.Submit("SHA256", text("done"), client.IdempotencyKey(key))
		}, protocol.StateCompleted},
		{"Failed", func(s *system, key string) string {
			return s.Submit("FAIL", map[string]int{"failUntilAttempt": 5}, client.IdempotencyKey(key), client.MaxAttempts(1))
		}, protocol.StateFailed},
		{"Cancelled", func(s *system, key string) string {
			id := s.Submit("SLEEP", map[string]int{"durationMillis": 600_000}, client.IdempotencyKey(key))
			s.WaitState(id, protocol.StateRunning)
			if ok, _, err := s.Client.Cancel(context.Background(), id); err != nil || !ok {
				s.T().Fatalf("cancel: %v %v", ok, err)
			}
			return id
		}, protocol.StateCancelled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t, withRetention(time.Second))
			s.StartWorker(2)
			active := s.Submit("SLEEP", map[string]int{"durationMillis": 600_000}, client.Priority(protocol.PriorityLow))
			id := tt.finish(s, "key-"+tt.name)
			if j := s.Wait(id); j.State != tt.want {
				t.Fatalf("job %+v, want %s", j, tt.want)
			}
			if !listed(s, id) {
				t.Fatal("a finished job within its retention is not listed")
			}
			s.Eventually("the finished job expired", func() bool { return gone(s, id) })
			if listed(s, id) {
				t.Fatal("an expired job is still listed")
			}
			if ok, _, err := s.Client.Cancel(context.Background(), id); ok || err == nil || !strings.Contains(err.Error(), "Unknown job") {
				t.Fatalf("cancel of an expired job: %v %v", ok, err)
			}
			again := s.Submit("SHA256", text("another submission"), client.IdempotencyKey("key-"+tt.name))
			if again == id {
				t.Fatal("the expired job's idempotency key still names it")
			}
			if j := s.Wait(again); j.State != protocol.StateCompleted {
				t.Fatalf("job submitted with the freed key: %+v", j)
			}
			if j := s.Status(active); !j.State.Active() {
				t.Fatalf("an active job changed: %+v", j)
			}
		})
	}
}

// TestFinishedJobsAreReadFromKV: a finished job keeps answering status, cancel, lists
// and its idempotency key from its record while retained, and across a restart.
func TestFinishedJobsAreReadFromKV(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.StartWorker(2)
	id := s.Submit("SHA256", text("kept"), client.IdempotencyKey("kept"))
	done := s.Wait(id)
	for restart := range 2 {
		if j := s.Status(id); j.State != protocol.StateCompleted || *j.Result != *done.Result {
			t.Fatalf("restart %d: status %+v", restart, j)
		}
		if ok, j, err := s.Client.Cancel(context.Background(), id); ok || err != nil || j.State != protocol.StateCompleted {
			t.Fatalf("restart %d: cancel of a finished job: %v %+v %v", restart, ok, j, err)
		}
		if again := s.Submit("SHA256", text("kept"), client.IdempotencyKey("kept")); again != id {
			t.Fatalf("restart %d: the same submission got %s, want %s", restart, again, id)
		}
		_, err := s.Client.Submit(context.Background(), "SHA256", text("other"), client.IdempotencyKey("kept"))
		if err == nil || !strings.Contains(err.Error(), "already bound") {
			t.Fatalf("restart %d: another submission with the key: %v", restart, err)
		}
		if !listed(s, id) {
			t.Fatalf("restart %d: not listed", restart)
		}
		s.RestartCoordinator(t)
	}
}

// TestListPagesAcrossExpiredJobs: paging visits every kept job once, newest first,
// while older finished jobs expire between them, and a restart after the expiry keeps
// the sequence growing.
func TestListPagesAcrossExpiredJobs(t *testing.T) {
	t.Parallel()
	s := setup(t, withRetention(time.Second))
	s.StartWorker(4)
	var old []string
	for range 5 {
		old = append(old, s.Submit("SHA256", text("old")))
	}
	for _, id := range old {
		s.Wait(id)
	}
	s.Eventually("the old jobs expired", func() bool { return gone(s, old[len(old)-1]) })
	s.RestartCoordinator(t, withRetention(time.Hour))
	s.StartWorker(4)
	var kept []string
	for i := range 7 {
		if i%2 == 0 {
			kept = append(kept, s.Submit("SHA256", text("kept")))
		} else {
			kept = append(kept, s.Submit("SLEEP", map[string]int{"durationMillis": 600_000}, client.Priority(protocol.PriorityLow)))
		}
	}
	for i := 0; i < len(kept); i += 2 {
		s.Wait(kept[i])
	}
	all := listAll(s, protocol.ListJobs{Limit: 2})
	if len(all) != len(kept) {
		t.Fatalf("listed %d jobs, want the %d kept: %+v", len(all), len(kept), all)
	}
	for i, j := range all { // newest first
		if want := kept[len(kept)-1-i]; j.JobID != want {
			t.Fatalf("position %d: %s, want %s", i, j.JobID, want)
		}
	}
	for _, id := range old {
		if !gone(s, id) {
			t.Fatalf("expired job %s came back after the restart", id)
		}
	}
}

func TestRetentionIsValidated(t *testing.T) {
	t.Parallel()
	cfg := coordinator.DefaultConfig()
	cfg.Retention = 500 * time.Millisecond
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "retention") {
		t.Fatalf("Validate = %v", err)
	}
	cfg.Retention = 0
	if err := cfg.Validate(); err != nil {
		t.Fatal(errors.Join(err, errors.New("0 keeps jobs forever")))
	}
}

// TestRestartKeepsARecordsRetention: a finished job that recovery reads whole (it holds
// a unique window) is kept for the retention its record was written with, as
// JetStream keeps the record, whatever --retention the restarted coordinator has. It
// was kept for the new one from its end: a restart with a shorter retention forgot it
// (Unknown job) while its record was stored for another hour.
func TestRestartKeepsARecordsRetention(t *testing.T) {
	t.Parallel()
	s := setup(t, withRetention(time.Hour))
	s.StartWorker(1)
	id := s.Submit("SHA256", text("unique"), client.UniqueFor(10*time.Minute))
	s.Wait(id)
	s.RestartCoordinator(t, withRetention(time.Second))
	s.StartWorker(1)
	// A job that ends after it, kept for a second: once it is gone, a second after the
	// first one's end has passed too.
	later := s.Submit("SHA256", text("later"))
	s.Wait(later)
	s.Eventually("the later job expired", func() bool { return gone(s, later) })
	if gone(s, id) {
		t.Fatalf("job %s, written to be kept an hour, forgotten a second after its end", id)
	}
}
