package suite

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

func testExecution(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	w, _ := s.StartWorker(4)
	cases := []struct {
		task    string
		payload string
		result  string
	}{
		{"SHA256", `{"text":"abc"}`, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"WORD_COUNT", `{"text":"the quick  brown fox"}`, "4"},
		{"WORD_COUNT", `{"text":""}`, "0"},
		{"PRIME_COUNT", `{"limit":100}`, "25"},
		{"SLEEP", `{"durationMillis":5}`, "slept 5 ms"},
		{"FAIL", `{"failUntilAttempt":0}`, "succeeded on attempt 1"},
	}
	for _, tc := range cases {
		t.Run(tc.task, func(t *testing.T) {
			id := s.Submit(tc.task, RawJSON(tc.payload))
			j := s.Wait(id)
			if j.State != protocol.StateCompleted || Deref(j.Result) != tc.result || j.Attempts != 1 {
				t.Fatalf("job = %+v result %q, want COMPLETED %q on attempt 1", j, Deref(j.Result), tc.result)
			}
			if j.WorkerID != nil {
				t.Errorf("workerId = %q on a finished job, want null", *j.WorkerID)
			}
			if Deref(j.LastWorkerID) != w.ID() {
				t.Errorf("lastWorkerId = %q on a finished job, want %q, the worker that ran it", Deref(j.LastWorkerID), w.ID())
			}
			if j.Priority != protocol.PriorityNormal || j.MaxAttempts != 3 {
				t.Errorf("priority %s maxAttempts %d, want NORMAL and the default 3", j.Priority, j.MaxAttempts)
			}
		})
	}
}

func testValidationErrors(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	cases := []struct {
		name, body, want string
	}{
		{"string integer", `{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":"5"},"maxAttempts":1}`, "Invalid payload: Field 'durationMillis' must be an integer"},
		{"out of range", `{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":700000},"maxAttempts":1}`, "Invalid payload: Field 'durationMillis' must be in [0, 600000], got 700000"},
		{"not an object", `{"type":"SUBMIT_JOB","taskType":"SHA256","payload":[1],"maxAttempts":1}`, "Invalid payload: Payload must be a JSON object"},
		{"text not a string", `{"type":"SUBMIT_JOB","taskType":"WORD_COUNT","payload":{"text":5},"maxAttempts":1}`, "Invalid payload: Field 'text' must be a string"},
		{"text too long", `{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"` + strings.Repeat("a", 200001) + `"},"maxAttempts":1}`, "Invalid payload: Field 'text' exceeds 200000 characters"},
		{"unknown task", `{"type":"SUBMIT_JOB","taskType":"RM_RF","payload":{},"maxAttempts":1}`, "Unknown task type: RM_RF"},
		{"unknown job", `{"type":"GET_JOB_STATUS","jobId":"nope"}`, "Unknown job: nope"},
		{"cancel unknown job", `{"type":"CANCEL_JOB","jobId":"nope"}`, "Unknown job: nope"},
		{"malformed", `{"type":"SUBMIT_JOB","maxAttempts":"x"}`, "Malformed request: "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var typ protocol.Type = protocol.TypeSubmitJob
			if pt, err := protocol.PeekType([]byte(tc.body)); err == nil {
				typ = pt
			}
			reply, err := s.Client.DoRaw(context.Background(), typ, []byte(tc.body))
			Must(t, err)
			m, err := protocol.Decode(reply)
			Must(t, err)
			e, ok := m.(*protocol.Error)
			if !ok || !strings.HasPrefix(e.Message, tc.want) {
				t.Fatalf("reply %s, want ERROR %q", reply, tc.want)
			}
		})
	}
	if page, err := s.Client.List(context.Background(), protocol.ListJobs{}); err != nil || len(page.Jobs) != 0 {
		t.Fatalf("rejected submissions created jobs: %v %v", page.Jobs, err)
	}
}

func testJobsSpreadOverWorkers(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	w1, _ := s.StartWorker(4)
	w2, _ := s.StartWorker(4)
	var ids []string
	for range 8 {
		ids = append(ids, s.Submit("SLEEP", map[string]int{"durationMillis": 1500})) // long enough for a loaded machine to see all eight at once
	}
	seen := map[string]int{}
	s.Eventually("8 jobs running", func() bool {
		clear(seen)
		for _, id := range ids {
			j := s.Status(id)
			if j.State != protocol.StateRunning && j.State != protocol.StateCompleted {
				return false
			}
			if j.WorkerID != nil {
				seen[*j.WorkerID]++
			}
		}
		return seen[w1.ID()] == 4 && seen[w2.ID()] == 4
	})
	for _, id := range ids {
		if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 {
			t.Fatalf("job %+v error %q, want COMPLETED on attempt 1", j, Deref(j.Error))
		}
	}
}

func testWorkerLoss(t *testing.T, tr Transport) {
	// The coordinator's clock moves only when the test moves it: the doomed worker's
	// silence lasts a heartbeat timeout when the test says so, and the worker that
	// runs the second attempt is never lost to a stall of a loaded machine.
	cases := []struct {
		name  string
		lose  func(m Peer, clk *jobbustest.Clock)
		cause string
	}{
		{"HeartbeatSilence", func(_ Peer, clk *jobbustest.Clock) { clk.Advance(2 * time.Minute) }, "heartbeat timeout"},
		{"Disconnect", func(m Peer, _ *jobbustest.Clock) { m.Disconnect() }, "connection closed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := jobbustest.NewClock(time.Now())
			s := Setup(t, tr, func(c *coordinator.Config) {
				c.Now, c.HeartbeatTimeout, c.TaskTimeout = clk.Now, time.Minute, time.Hour
			})
			dead := s.SilentWorker("doomed", 1)
			id := s.Submit("SHA256", Text("x"))
			a := s.NextAssign(dead)
			if a.AttemptNumber != 1 || a.JobID != id {
				t.Fatalf("assignment %+v", a)
			}
			tc.lose(dead, clk)
			want := fmt.Sprintf("worker doomed lost (%s)", tc.cause)
			s.Eventually("the attempt lost with the worker", func() bool {
				j := s.Status(id)
				return j.State != protocol.StateRunning && Deref(j.Error) == want
			})
			clk.Advance(time.Second) // past the retry delay, far from another timeout
			if j := s.Status(id); Deref(j.LastWorkerID) != "doomed" || j.WorkerID != nil {
				t.Errorf("after the loss: workerId %q, lastWorkerId %q; want none and doomed", Deref(j.WorkerID), Deref(j.LastWorkerID))
			}
			w, _ := s.StartWorker(4)
			j := s.Wait(id)
			if j.State != protocol.StateCompleted || j.Attempts != 2 || Deref(j.Error) != want {
				t.Fatalf("job %+v error %q, want COMPLETED on attempt 2 with error %q", j, Deref(j.Error), want)
			}
			if Deref(j.LastWorkerID) != w.ID() {
				t.Errorf("lastWorkerId %q, want %q, which ran the second attempt", Deref(j.LastWorkerID), w.ID())
			}
			s.Reject(dead, a, true, "late")
		})
	}
}

func testRetries(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	s.StartWorker(4)
	cases := []struct {
		name        string
		failUntil   int
		maxAttempts int
		state       protocol.State
		attempts    int
		errText     string
		result      string
	}{
		{"ExhaustsAttempts", 999, 2, protocol.StateFailed, 2, "deliberate failure on attempt 2 (failing until 999) (all 2 attempts used)", ""},
		{"SucceedsOnSecondAttempt", 2, 3, protocol.StateCompleted, 2, "deliberate failure on attempt 1 (failing until 2)", "succeeded on attempt 2"},
		{"MaxAttemptsOne", 5, 1, protocol.StateFailed, 1, "deliberate failure on attempt 1 (failing until 5) (all 1 attempts used)", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := s.Submit("FAIL", map[string]int{"failUntilAttempt": tc.failUntil}, client.MaxAttempts(tc.maxAttempts))
			j := s.Wait(id)
			if j.State != tc.state || j.Attempts != tc.attempts || Deref(j.Error) != tc.errText || (tc.result != "" && Deref(j.Result) != tc.result) {
				t.Fatalf("job %+v error %q result %q, want %s after %d attempts with %q", j, Deref(j.Error), Deref(j.Result), tc.state, tc.attempts, tc.errText)
			}
		})
	}
}

func testStaleResults(t *testing.T, tr Transport) {
	t.Run("SupersededAttempt", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr)
		m := s.ManualWorker("w1", 1)
		id := s.Submit("SHA256", Text("x"))
		first := s.NextAssign(m)
		m.Register(1) // re-registering supersedes the session: attempt 1 is lost
		second := s.NextAssign(m)
		if second.AttemptNumber != 2 || second.AttemptID == first.AttemptID {
			t.Fatalf("second assignment %+v", second)
		}
		s.Reject(m, first, true, "stale")
		if j := s.Status(id); j.State != protocol.StateRunning {
			t.Fatalf("stale result moved the job to %s", j.State)
		}
		s.Accept(m, second, true, "fresh")
		j := s.Status(id)
		if j.State != protocol.StateCompleted || Deref(j.Result) != "fresh" || Deref(j.Error) != "worker w1 lost (worker re-registered)" {
			t.Fatalf("job %+v result %q error %q", j, Deref(j.Result), Deref(j.Error))
		}
	})
	t.Run("Duplicate", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr)
		m := s.ManualWorker("w1", 1)
		id := s.Submit("SHA256", Text("x"))
		a := s.NextAssign(m)
		s.Accept(m, a, true, "one")
		s.Reject(m, a, false, "two")
		if j := s.Status(id); j.State != protocol.StateCompleted || Deref(j.Result) != "one" || j.Error != nil {
			t.Fatalf("job %+v error %q", j, Deref(j.Error))
		}
	})
	t.Run("MidRetry", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr, func(c *coordinator.Config) { c.RetryBaseDelay, c.RetryMaxDelay = time.Hour, time.Hour })
		m := s.ManualWorker("w1", 1)
		id := s.Submit("SHA256", Text("x"))
		a := s.NextAssign(m)
		s.Accept(m, a, false, "boom")
		s.Reject(m, a, true, "late success")
		if j := s.Status(id); j.State != protocol.StateRetryWait || Deref(j.Error) != "boom" || j.Result != nil {
			t.Fatalf("job %+v", j)
		}
	})
}

func testDeadline(t *testing.T, tr Transport) {
	s := Setup(t, tr, func(c *coordinator.Config) { c.TaskTimeout = 100 * time.Millisecond })
	m := s.ManualWorker("slow", 1)
	id := s.Submit("SLEEP", map[string]int{"durationMillis": 30000}, client.MaxAttempts(1))
	a := s.NextAssign(m)
	c := s.NextCancel(m)
	if c.JobID != a.JobID || c.AttemptID != a.AttemptID {
		t.Fatalf("cancel %+v for assignment %+v", c, a)
	}
	j := s.WaitState(id, protocol.StateFailed)
	if want := "execution deadline exceeded (100 ms) on worker slow (all 1 attempts used)"; Deref(j.Error) != want {
		t.Fatalf("error %q, want %q", Deref(j.Error), want)
	}
	if Deref(j.LastWorkerID) != "slow" {
		t.Errorf("lastWorkerId %q, want slow", Deref(j.LastWorkerID))
	}
	s.Reject(m, a, true, "too late")
}

func testCancel(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	w, stopWorker := s.StartWorker(1)
	ctx := context.Background()

	running := s.Submit("SLEEP", map[string]int{"durationMillis": 30000})
	s.WaitState(running, protocol.StateRunning)
	queued := s.Submit("SHA256", Text("waits behind the sleep"))
	start := time.Now()
	ok, j, err := s.Client.Cancel(ctx, running)
	Must(t, err)
	if !ok || j.State != protocol.StateCancelled || Deref(j.Error) != "cancelled by client request" || j.WorkerID != nil {
		t.Fatalf("cancel running: %v %+v", ok, j)
	}
	if Deref(j.LastWorkerID) != w.ID() {
		t.Errorf("cancelled while running: lastWorkerId %q, want %q", Deref(j.LastWorkerID), w.ID())
	}
	// The slot is free again: the queued job runs on the same single-slot worker.
	if j := s.Wait(queued); j.State != protocol.StateCompleted {
		t.Fatalf("queued job %+v", j)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("30 s sleep cancelled and slot reused after %v", took)
	}
	s.Eventually("the sleep attempt ends on the worker", func() bool { return w.Running() == 0 })
	if j := s.Status(running); j.State != protocol.StateCancelled {
		t.Fatalf("the cancelled job's late result changed it: %+v", j)
	}

	again, j, err := s.Client.Cancel(ctx, running)
	Must(t, err)
	if again || j.State != protocol.StateCancelled {
		t.Fatalf("second cancel: %v %+v", again, j)
	}
	done, j, err := s.Client.Cancel(ctx, queued)
	Must(t, err)
	if done || j.State != protocol.StateCompleted {
		t.Fatalf("cancel of a completed job: %v %+v", done, j)
	}

	// A QUEUED job cancels too, and never runs.
	stopWorker()
	busy := s.ManualWorker("busy", 1)
	s.Submit("SLEEP", map[string]int{"durationMillis": 30000})
	s.NextAssign(busy)
	id := s.Submit("SHA256", Text("q"))
	ok, j, err = s.Client.Cancel(ctx, id)
	Must(t, err)
	if !ok || j.State != protocol.StateCancelled || j.Attempts != 0 {
		t.Fatalf("cancel queued: %v %+v", ok, j)
	}
}

func testCancelRetryWait(t *testing.T, tr Transport) {
	s := Setup(t, tr, func(c *coordinator.Config) { c.RetryBaseDelay, c.RetryMaxDelay = time.Hour, time.Hour })
	m := s.ManualWorker("w", 1)
	id := s.Submit("SHA256", Text("x"))
	s.Accept(m, s.NextAssign(m), false, "boom")
	ok, j, err := s.Client.Cancel(context.Background(), id)
	Must(t, err)
	if !ok || j.State != protocol.StateCancelled || Deref(j.Error) != "cancelled by client request" {
		t.Fatalf("cancel in RETRY_WAIT: %v %+v", ok, j)
	}
}

func testSchedulingSafety(t *testing.T, tr Transport) {
	s := Setup(t, tr)
	var workers []Peer
	for i := range 5 {
		workers = append(workers, s.ManualWorker(fmt.Sprintf("w%d", i), 4))
	}
	var mu sync.Mutex
	submitted := map[string]bool{}
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 15 {
				id, err := s.Client.Submit(context.Background(), "SHA256", Text(fmt.Sprintf("%d-%d", c, i)))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				submitted[id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assigned := map[string]int{}
	for len(assigned) < 60 {
		progress := false
		for _, w := range workers {
			select {
			case a := <-w.Assignments():
				progress = true
				assigned[a.JobID]++
				if a.AttemptNumber != 1 {
					t.Errorf("job %s assigned on attempt %d", a.JobID, a.AttemptNumber)
				}
				s.Accept(w, a, true, "ok")
			default:
			}
		}
		if !progress {
			select {
			case <-time.After(5 * time.Millisecond):
			case <-t.Context().Done():
				return
			}
		}
	}
	for id := range submitted {
		if assigned[id] != 1 {
			t.Errorf("job %s assigned %d times", id, assigned[id])
		}
	}
	time.Sleep(20 * time.Millisecond) // a spurious second assignment would arrive by now
	for _, w := range workers {
		if len(w.Assignments()) != 0 {
			t.Errorf("worker %s got an extra assignment", w.ID())
		}
	}
}

func testAdmissionControl(t *testing.T, tr Transport) {
	t.Run("RejectsAtLimit", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr, func(c *coordinator.Config) { c.MaxActiveJobs = 5 })
		for range 5 {
			s.Submit("SHA256", Text("x"))
		}
		_, err := s.Client.Submit(context.Background(), "SHA256", Text("x"))
		var rej *client.RejectedError
		if !errors.As(err, &rej) || !errors.Is(err, client.ErrRejected) {
			t.Fatalf("sixth submission: %v, want SUBMIT_REJECTED", err)
		}
		want := protocol.SubmitRejected{Reason: "coordinator at capacity: 5 active jobs (limit 5)", ActiveCount: 5, Limit: 5, Retryable: true}
		if rej.SubmitRejected != want {
			t.Fatalf("rejection %+v, want %+v", rej.SubmitRejected, want)
		}
		// The count is rebuilt on restart and may sit above a lowered limit.
		s.RestartCoordinator(t, func(c *coordinator.Config) { c.MaxActiveJobs = 3 })
		_, err = s.Client.Submit(context.Background(), "SHA256", Text("x"))
		if !errors.As(err, &rej) || rej.ActiveCount != 5 || rej.Limit != 3 {
			t.Fatalf("after restart: %v %+v", err, rej)
		}
		// Finishing work makes room again; retries are never re-admitted.
		s.StartWorker(4)
		s.Eventually("room again", func() bool {
			_, err := s.Client.Submit(context.Background(), "FAIL", map[string]int{"failUntilAttempt": 2})
			return err == nil
		})
	})
	t.Run("ExactUnderRacingClients", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr, func(c *coordinator.Config) { c.MaxActiveJobs = 20 })
		var accepted, rejected sync.WaitGroup
		var mu sync.Mutex
		ok, no := 0, 0
		for range 8 {
			accepted.Add(1)
			go func() {
				defer accepted.Done()
				for range 10 {
					_, err := s.Client.Submit(context.Background(), "SHA256", Text("x"))
					mu.Lock()
					switch {
					case err == nil:
						ok++
					case errors.Is(err, client.ErrRejected):
						no++
					default:
						t.Error(err)
					}
					mu.Unlock()
				}
			}()
		}
		accepted.Wait()
		rejected.Wait()
		if ok != 20 || no != 60 {
			t.Fatalf("admitted %d, rejected %d; want exactly 20 and 60", ok, no)
		}
	})
}

func testIdempotency(t *testing.T, tr Transport) {
	s := Setup(t, tr, func(c *coordinator.Config) { c.MaxActiveJobs = 1 })
	ctx := context.Background()
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := s.Client.Submit(ctx, "SHA256", RawJSON(`{"text":"a","extra":[1,2]}`), client.IdempotencyKey("k1"))
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent duplicates made different jobs: %v", ids)
		}
	}
	// The same request, written differently (key order, spacing, explicit NORMAL and
	// the default maxAttempts), is the same submission, even at the admission limit.
	same, err := s.Client.Submit(ctx, "SHA256", RawJSON(`{ "extra":[1,2], "text":"a" }`),
		client.IdempotencyKey("k1"), client.Priority(protocol.PriorityNormal), client.MaxAttempts(3))
	Must(t, err)
	if same != ids[0] {
		t.Fatalf("equal request got job %s, want %s", same, ids[0])
	}
	conflicts := []struct {
		name string
		task string
		body string
		opts []client.SubmitOption
	}{
		{"TaskType", "WORD_COUNT", `{"text":"a","extra":[1,2]}`, nil},
		{"Payload", "SHA256", `{"text":"b","extra":[1,2]}`, nil},
		{"MaxAttempts", "SHA256", `{"text":"a","extra":[1,2]}`, []client.SubmitOption{client.MaxAttempts(2)}},
		{"Priority", "SHA256", `{"text":"a","extra":[1,2]}`, []client.SubmitOption{client.Priority(protocol.PriorityHigh)}},
	}
	for _, c := range conflicts {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.Client.Submit(ctx, c.task, RawJSON(c.body), append(c.opts, client.IdempotencyKey("k1"))...)
			want := fmt.Sprintf("Idempotency key 'k1' is already bound to a different submission (job %s)", ids[0])
			if !errors.Is(err, client.ErrServer) || err.Error() != want {
				t.Fatalf("err %v, want %q", err, want)
			}
		})
	}
	// Terminal jobs keep their key; the binding survives a restart.
	_, _, err = s.Client.Cancel(ctx, ids[0])
	Must(t, err)
	s.RestartCoordinator(t)
	again, err := s.Client.Submit(ctx, "SHA256", RawJSON(`{"text":"a","extra":[1,2]}`), client.IdempotencyKey("k1"))
	Must(t, err)
	if again != ids[0] {
		t.Fatalf("after restart the key gave job %s, want %s", again, ids[0])
	}
	page, err := s.Client.List(ctx, protocol.ListJobs{})
	Must(t, err)
	if len(page.Jobs) != 1 {
		t.Fatalf("%d jobs exist, want 1", len(page.Jobs))
	}
}

// testListIsBounded fills the coordinator with more jobs than fit in one reply: a list
// without a limit holds the newest that fit in 1 MiB, and paging with limit and cursor
// visits every job once, newest first.
func testListIsBounded(t *testing.T, tr Transport) {
	// A list reads each finished job's record from the store: a thousand of them, under
	// -race on two busy cores, may take longer than a request's default 5 s, which
	// the bridge holds a TCP client's request to as well.
	s := setupBridged(t, tr, []func(*bridge.Config){func(c *bridge.Config) { c.RequestTimeout = time.Minute }})
	ctx := context.Background()
	const n = 4500 // cancelled, with their error text, their snapshots make about 1.2 MiB
	ids := make([]string, n)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				id, err := s.Client.Submit(ctx, "SHA256", Text("x"))
				if err == nil {
					// Cancelled jobs carry an error text, which makes their snapshots larger.
					_, _, err = s.Client.Cancel(ctx, id)
				}
				if err != nil {
					t.Error(err)
					return
				}
				ids[i] = id
			}
		}()
	}
	wg.Wait()

	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	raw, err := s.Client.DoRaw(ctx, protocol.TypeListJobs, []byte(`{"type":"LIST_JOBS"}`))
	Must(t, err)
	if len(raw) > protocol.MaxMessage {
		t.Fatalf("JOB_LIST of %d bytes exceeds %d", len(raw), protocol.MaxMessage)
	}
	m, err := protocol.Decode(raw)
	Must(t, err)
	all, ok := m.(*protocol.JobList)
	if !ok {
		t.Fatalf("list without a limit answered %T %+v, want a JOB_LIST", m, m)
	}
	if len(all.Jobs) == 0 || len(all.Jobs) == n || len(raw) < protocol.MaxMessage-1024 || all.NextCursor != "" {
		t.Fatalf("%d of %d jobs in %d bytes (cursor %q): want the newest that fill 1 MiB, and no cursor for a spec peer", len(all.Jobs), n, len(raw), all.NextCursor)
	}

	// A state filter is read like the CLI's --state: case-insensitively.
	cancelled := protocol.State("cancelled")
	filtered, err := s.Client.List(ctx, protocol.ListJobs{State: &cancelled, Limit: 10})
	Must(t, err)
	if len(filtered.Jobs) != 10 || filtered.Jobs[0].State != protocol.StateCancelled {
		t.Fatalf("list of state %q: %d jobs", cancelled, len(filtered.Jobs))
	}
	bogus := protocol.State("DONE")
	if _, err := s.Client.List(ctx, protocol.ListJobs{State: &bogus}); err == nil || !strings.Contains(err.Error(), "Invalid state") {
		t.Fatalf("list of an unknown state: %v", err)
	}

	seen := map[string]bool{}
	var last int64 = 1 << 62
	req := protocol.ListJobs{Limit: 250}
	for pages := 0; ; pages++ {
		page, err := s.Client.List(ctx, req)
		Must(t, err)
		for _, j := range page.Jobs {
			if seen[j.JobID] {
				t.Fatalf("job %s listed twice", j.JobID)
			}
			seen[j.JobID] = true
			if j.CreatedAtMillis > last {
				t.Fatalf("page not newest first")
			}
			last = j.CreatedAtMillis
		}
		if page.NextCursor == "" {
			break
		}
		req.Cursor = page.NextCursor
		if pages > n {
			t.Fatal("paging does not end")
		}
	}
	if len(seen) != n {
		t.Fatalf("paging visited %d of %d jobs", len(seen), n)
	}
	if first := all.Jobs[0].JobID; !seen[first] {
		t.Fatalf("unbounded list's newest job %s unknown", first)
	}
}

func testRestart(t *testing.T, tr Transport) {
	t.Run("CompletedJobsSurvive", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr)
		_, stop := s.StartWorker(4)
		id := s.Submit("SHA256", Text("abc"))
		before := s.Wait(id)
		stop()
		s.RestartCoordinator(t)
		if after := s.Status(id); !reflect.DeepEqual(after, before) {
			t.Fatalf("after restart %+v, before %+v", after, before)
		}
	})
	t.Run("RunningAttemptGoesOn", func(t *testing.T) {
		// A real worker runs a job's only attempt across a restart of the
		// coordinator: it reports the attempt when it registers again, keeps it, and
		// its result counts.
		t.Parallel()
		s := Setup(t, tr)
		s.StartWorker(2)
		id := s.Submit("SLEEP", map[string]int{"durationMillis": 1000}, client.MaxAttempts(1))
		s.WaitState(id, protocol.StateRunning)
		s.RestartCoordinator(t)
		if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 {
			t.Fatalf("job %+v error %q, want COMPLETED on its one attempt", j, Deref(j.Error))
		}
	})
	t.Run("RunningJobRunsAgain", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr)
		m := s.SilentWorker("gone", 1)
		id := s.Submit("SHA256", Text("abc"))
		first := s.NextAssign(m)
		const grace = 300 * time.Millisecond
		restarted := time.Now()
		s.RestartCoordinator(t, func(c *coordinator.Config) { c.ClaimGrace = grace })
		if j := s.Status(id); j.State != protocol.StateRunning || j.Attempts != 1 {
			t.Fatalf("after restart %+v, want RUNNING: its worker may claim the attempt", j)
		}
		fresh := s.ManualWorker("fresh", 1)
		again := s.NextAssign(fresh)
		if since := time.Since(restarted); since < grace {
			t.Fatalf("assigned again %v after the restart, within the claim grace (%v)", since, grace)
		}
		if again.JobID != id || again.AttemptNumber != 2 {
			t.Fatalf("assigned %+v, want job %s's attempt 2: the unclaimed one counts", again, id)
		}
		s.Reject(m, first, true, "from the old lease")
		s.Accept(fresh, again, true, "done")
		if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 2 || Deref(j.LastWorkerID) != "fresh" {
			t.Fatalf("job %+v (last worker %q), want COMPLETED on attempt 2, on fresh", j, Deref(j.LastWorkerID))
		}
	})
	t.Run("FinalAttemptFails", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr)
		m := s.SilentWorker("gone", 1)
		id := s.Submit("SHA256", Text("abc"), client.MaxAttempts(1))
		s.NextAssign(m)
		s.RestartCoordinator(t, func(c *coordinator.Config) { c.ClaimGrace = 300 * time.Millisecond })
		j := s.WaitState(id, protocol.StateFailed)
		if Deref(j.Error) != "coordinator restarted during final attempt; outcome unknown" || Deref(j.LastWorkerID) != "gone" {
			t.Fatalf("after restart %+v error %q last worker %q", j, Deref(j.Error), Deref(j.LastWorkerID))
		}
	})
	t.Run("ResultAfterRestartCounts", func(t *testing.T) {
		// A result delivered to the new coordinator before its worker registered
		// again counts: the attempt is still the job's.
		t.Parallel()
		s := Setup(t, tr)
		m := s.SilentWorker("w", 1)
		id := s.Submit("SHA256", Text("abc"), client.MaxAttempts(1))
		a := s.NextAssign(m)
		s.RestartCoordinator(t)
		s.Accept(m, a, true, "done after the restart")
		if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 || Deref(j.Result) != "done after the restart" {
			t.Fatalf("job %+v result %q error %q", j, Deref(j.Result), Deref(j.Error))
		}
	})
	t.Run("StaleDeadlineNotApplied", func(t *testing.T) {
		t.Parallel()
		clk := jobbustest.NewClock(time.Now())
		s := Setup(t, tr, func(c *coordinator.Config) {
			c.Now, c.TaskTimeout, c.HeartbeatTimeout = clk.Now, time.Minute, time.Hour
		})
		old := s.SilentWorker("old", 1)
		id := s.Submit("SHA256", Text("abc"))
		s.NextAssign(old) // its deadline: t0 + 60s
		clk.Advance(50 * time.Second)
		s.RestartCoordinator(t, func(c *coordinator.Config) { c.ClaimGrace = 5 * time.Second })
		fresh := s.SilentWorker("fresh", 2)
		clk.Advance(6 * time.Second) // nobody claimed the first attempt: it is lost
		a := s.NextAssign(fresh)     // its deadline: t0 + 116s
		if a.JobID != id || a.AttemptNumber != 2 {
			t.Fatalf("assigned %+v, want job %s's attempt 2", a, id)
		}
		probe := s.Submit("FAIL", map[string]int{"failUntilAttempt": 2})
		s.Accept(fresh, s.NextAssign(fresh), false, "probe fails once")
		clk.Advance(20 * time.Second) // past the first attempt's deadline only
		// The sweep that releases the probe's retry would also apply any deadline due.
		s.Eventually("a sweep at t0+76s", func() bool { return s.Status(probe).State != protocol.StateRetryWait })
		if j := s.Status(id); j.State != protocol.StateRunning || j.Attempts != 2 {
			t.Fatalf("the second attempt was cut short: %+v (error %q)", j, Deref(j.Error))
		}
		s.Accept(fresh, a, true, "done")
		if j := s.Status(id); j.State != protocol.StateCompleted || j.Error != nil {
			t.Fatalf("job %+v error %q", j, Deref(j.Error))
		}
	})
	t.Run("PriorityAndSequenceSurvive", func(t *testing.T) {
		t.Parallel()
		s := Setup(t, tr)
		low := s.Submit("SHA256", Text("1"), client.Priority(protocol.PriorityLow))
		normal := s.Submit("SHA256", Text("2"))
		high := s.Submit("SHA256", Text("3"), client.Priority(protocol.PriorityHigh))
		s.RestartCoordinator(t)
		normal2 := s.Submit("SHA256", Text("4"))
		got := runOneByOne(s, 4)
		want := []string{high, normal, normal2, low}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("order after restart %v, want %v", got, want)
		}
		page, err := s.Client.List(context.Background(), protocol.ListJobs{})
		Must(t, err)
		if len(page.Jobs) != 4 || page.Jobs[0].JobID != normal2 || page.Jobs[3].JobID != low {
			t.Fatalf("list newest first: %+v", page.Jobs)
		}
	})
}

// runOneByOne registers a one-slot worker and returns the order it is given n jobs in.
func runOneByOne(s *System, n int) []string {
	s.t.Helper()
	m := s.ManualWorker("one-by-one", 1)
	var order []string
	for range n {
		a := s.NextAssign(m)
		order = append(order, a.JobID)
		s.Accept(m, a, true, "ok")
	}
	return order
}

func testPriorityOrder(t *testing.T, tr Transport) {
	clk := jobbustest.NewClock(time.Now())
	s := Setup(t, tr, func(c *coordinator.Config) {
		c.Now = clk.Now
		c.AgingStep = time.Minute
		c.HeartbeatTimeout = time.Hour // the clock stands still between steps
	})
	lowOld := s.Submit("SHA256", Text("a"), client.Priority(protocol.PriorityLow))
	normalOld := s.Submit("SHA256", Text("b"))
	clk.Advance(time.Minute) // lowOld is NORMAL now, normalOld HIGH
	high := s.Submit("SHA256", Text("c"), client.Priority(protocol.PriorityHigh))
	normal := s.Submit("SHA256", Text("d"), client.Priority(protocol.PriorityNormal))
	low := s.Submit("SHA256", Text("e"), client.Priority(protocol.PriorityLow))
	got := runOneByOne(s, 5)
	// Effective: normalOld HIGH(seq 2), high HIGH(3), lowOld NORMAL(1), normal NORMAL(4), low LOW(5).
	want := []string{normalOld, high, lowOld, normal, low}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("order %v,\nwant  %v", got, want)
	}
	if j := s.Status(lowOld); j.Priority != protocol.PriorityLow {
		t.Fatalf("snapshot shows priority %s, want the base LOW", j.Priority)
	}
}
