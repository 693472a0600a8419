package coordinator_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// TestUniqueFor: a job unique for a window is the answer to every submission of its
// task type and payload (the payload compared as canonical JSON) until the window ends,
// completed or not; a failed or cancelled one holds nothing; other payloads, other
// types and submissions that ask for no uniqueness are jobs of their own.
func TestUniqueFor(t *testing.T) {
	t.Parallel()
	clk := jobbustest.NewClock(time.Now())
	s := setup(t, func(c *coordinator.Config) { c.Now, c.HeartbeatTimeout = clk.Now, 48*time.Hour })
	hour := client.UniqueFor(time.Hour)
	first := s.Submit("SHA256", text("x"), hour)
	for _, again := range []struct {
		what    string
		payload any
		opts    []client.SubmitOption
	}{
		{"the same", text("x"), []client.SubmitOption{hour}},
		{"spaced and reordered", json.RawMessage(`{ "text" :  "x" }`), []client.SubmitOption{hour}},
		{"with another window", text("x"), []client.SubmitOption{client.UniqueFor(time.Minute)}},
		{"unique while active", text("x"), []client.SubmitOption{client.UniqueWhileActive()}},
		{"with a priority", text("x"), []client.SubmitOption{hour, client.Priority(protocol.PriorityHigh)}},
	} {
		if got := s.Submit("SHA256", again.payload, again.opts...); got != first {
			t.Fatalf("%s: got job %s, want the unique job %s", again.what, got, first)
		}
	}
	for what, id := range map[string]string{
		"another payload":    s.Submit("SHA256", text("y"), hour),
		"another type":       s.Submit("WORD_COUNT", text("x"), hour),
		"no uniqueness":      s.Submit("SHA256", text("x")),
		"an idempotency key": s.Submit("SHA256", text("x"), client.IdempotencyKey("k")),
	} {
		if id == first {
			t.Fatalf("%s: answered with the unique job %s", what, first)
		}
	}
	s.StartWorker(4)
	if j := s.Wait(first); j.State != protocol.StateCompleted {
		t.Fatalf("unique job: %+v", j)
	}
	// A job that failed releases its key.
	failing := s.Submit("FAIL", map[string]int{"failUntilAttempt": 9}, hour, client.MaxAttempts(1))
	if j := s.Wait(failing); j.State != protocol.StateFailed {
		t.Fatalf("failing job: %+v", j)
	}
	if got := s.Submit("FAIL", map[string]int{"failUntilAttempt": 9}, hour, client.MaxAttempts(1)); got == failing {
		t.Fatal("a failed job still holds its key")
	}

	clk.Advance(59 * time.Minute)
	if got := s.Submit("SHA256", text("x"), hour); got != first {
		t.Fatalf("completed, within its window: got %s, want %s", got, first)
	}
	clk.Advance(time.Minute)
	second := s.Submit("SHA256", text("x"), hour)
	if second == first {
		t.Fatal("the window ended, yet the old job answered")
	}
	if got := s.Submit("SHA256", text("x"), hour); got != second {
		t.Fatalf("the new job holds the key: got %s, want %s", got, second)
	}

}

// TestUniqueWhileActive: a job unique while active answers for its work until it ends;
// then the same work is a new job.
func TestUniqueWhileActive(t *testing.T) {
	t.Parallel()
	s := setup(t)
	active := client.UniqueWhileActive()
	first := s.Submit("SHA256", text("x"), active)
	if got := s.Submit("SHA256", text("x"), active); got != first {
		t.Fatalf("queued: got %s, want %s", got, first)
	}
	if got := s.Submit("SHA256", text("x"), client.UniqueFor(time.Hour)); got != first {
		t.Fatalf("unique for an hour, while the active one is queued: got %s, want %s", got, first)
	}
	if _, _, err := s.Client.Cancel(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	second := s.Submit("SHA256", text("x"), active)
	if second == first {
		t.Fatal("a cancelled job still holds its key")
	}
	s.StartWorker(2)
	if j := s.Wait(second); j.State != protocol.StateCompleted {
		t.Fatalf("job %+v", j)
	}
	third := s.Submit("SHA256", text("x"), active)
	if third == second {
		t.Fatal("a completed job, unique while active, still holds its key")
	}
	s.Wait(third)
}

// TestUniqueConcurrent: submissions of the same unique work at once make one job, and
// every one of them is answered with its id.
func TestUniqueConcurrent(t *testing.T) {
	t.Parallel()
	s := setup(t)
	const n = 32
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = s.Submit("SHA256", text("at once"), client.UniqueFor(time.Hour))
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent unique submissions made jobs %v", ids)
		}
	}
	page, err := s.Client.List(context.Background(), protocol.ListJobs{})
	must(t, err)
	if len(page.Jobs) != 1 {
		t.Fatalf("%d jobs stored, want 1", len(page.Jobs))
	}
}

// TestUniqueBadInput: uniqueness the coordinator cannot honour is refused, and nothing
// is stored.
func TestUniqueBadInput(t *testing.T) {
	t.Parallel()
	s := setup(t)
	cases := []struct {
		mod  func(*protocol.SubmitJob)
		says string
	}{
		{func(r *protocol.SubmitJob) { r.UniqueForMillis = -5 }, "Invalid uniqueness: uniqueForMillis must be in [1, 2592000000], got -5"},
		{func(r *protocol.SubmitJob) { r.UniqueForMillis = 31 * 24 * 3600 * 1000 }, "uniqueForMillis must be in [1, 2592000000]"},
		{func(r *protocol.SubmitJob) { r.UniqueWhile = "forever" }, `Invalid uniqueness: uniqueWhile must be "active", got "forever"`},
		{func(r *protocol.SubmitJob) { r.UniqueWhile, r.UniqueForMillis = "active", 1000 }, "give uniqueForMillis or uniqueWhile, not both"},
	}
	for _, c := range cases {
		req := &protocol.SubmitJob{TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`)}
		c.mod(req)
		m, err := s.Client.Do(context.Background(), req)
		must(t, err)
		if e, ok := m.(*protocol.Error); !ok || !strings.Contains(e.Message, c.says) {
			t.Errorf("%+v answered %+v, want an ERROR saying %q", req, m, c.says)
		}
	}
	page, err := s.Client.List(context.Background(), protocol.ListJobs{})
	must(t, err)
	if len(page.Jobs) != 0 {
		t.Fatalf("bad submissions stored %d jobs", len(page.Jobs))
	}
}
