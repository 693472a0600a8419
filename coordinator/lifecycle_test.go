package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
)

func TestExecution(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		s := setup(t, tr)
		s.startWorker(4)
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
				id := s.submit(tc.task, rawJSON(tc.payload))
				j := s.wait(id)
				if j.State != protocol.StateCompleted || deref(j.Result) != tc.result || j.Attempts != 1 {
					t.Fatalf("job = %+v result %q, want COMPLETED %q on attempt 1", j, deref(j.Result), tc.result)
				}
				if j.WorkerID != nil {
					t.Errorf("workerId = %q on a finished job, want null", *j.WorkerID)
				}
				if j.Priority != protocol.PriorityNormal || j.MaxAttempts != 3 {
					t.Errorf("priority %s maxAttempts %d, want NORMAL and the default 3", j.Priority, j.MaxAttempts)
				}
			})
		}
	})
}

func TestValidationErrors(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		s := setup(t, tr)
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
				reply, err := s.client.DoRaw(context.Background(), typ, []byte(tc.body))
				must(t, err)
				m, err := protocol.Decode(reply)
				must(t, err)
				e, ok := m.(*protocol.Error)
				if !ok || !strings.HasPrefix(e.Message, tc.want) {
					t.Fatalf("reply %s, want ERROR %q", reply, tc.want)
				}
			})
		}
		if page, err := s.client.List(context.Background(), protocol.ListJobs{}); err != nil || len(page.Jobs) != 0 {
			t.Fatalf("rejected submissions created jobs: %v %v", page.Jobs, err)
		}
	})
}

func TestJobsSpreadOverWorkers(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		s := setup(t, tr)
		w1, _ := s.startWorker(4)
		w2, _ := s.startWorker(4)
		var ids []string
		for range 8 {
			ids = append(ids, s.submit("SLEEP", map[string]int{"durationMillis": 300}))
		}
		seen := map[string]int{}
		s.eventually("8 jobs running", func() bool {
			clear(seen)
			for _, id := range ids {
				j := s.status(id)
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
			if j := s.wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 {
				t.Fatalf("job %+v, want COMPLETED on attempt 1", j)
			}
		}
	})
}

func TestWorkerLoss(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		cases := []struct {
			name  string
			lose  func(m peer)
			cause string
		}{
			{"HeartbeatSilence", func(peer) {}, "heartbeat timeout"},
			{"Disconnect", func(m peer) { m.disconnect() }, "connection closed"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				s := setup(t, tr)
				dead := s.silentWorker("doomed", 1)
				id := s.submit("SHA256", text("x"))
				a := s.nextAssign(dead)
				if a.AttemptNumber != 1 || a.JobID != id {
					t.Fatalf("assignment %+v", a)
				}
				tc.lose(dead)
				want := fmt.Sprintf("worker doomed lost (%s)", tc.cause)
				s.eventually("the attempt lost with the worker", func() bool {
					j := s.status(id)
					return j.State != protocol.StateRunning && deref(j.Error) == want
				})
				s.startWorker(4)
				j := s.wait(id)
				if j.State != protocol.StateCompleted || j.Attempts != 2 || deref(j.Error) != want {
					t.Fatalf("job %+v error %q, want COMPLETED on attempt 2 with error %q", j, deref(j.Error), want)
				}
				s.reject(dead, a, true, "late")
			})
		}
	})
}

func TestRetries(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		s := setup(t, tr)
		s.startWorker(4)
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
				id := s.submit("FAIL", map[string]int{"failUntilAttempt": tc.failUntil}, client.MaxAttempts(tc.maxAttempts))
				j := s.wait(id)
				if j.State != tc.state || j.Attempts != tc.attempts || deref(j.Error) != tc.errText || (tc.result != "" && deref(j.Result) != tc.result) {
					t.Fatalf("job %+v error %q result %q, want %s after %d attempts with %q", j, deref(j.Error), deref(j.Result), tc.state, tc.attempts, tc.errText)
				}
			})
		}
	})
}

func TestStaleResults(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		t.Run("SupersededAttempt", func(t *testing.T) {
			t.Parallel()
			s := setup(t, tr)
			m := s.manualWorker("w1", 1)
			id := s.submit("SHA256", text("x"))
			first := s.nextAssign(m)
			m.register(1) // re-registering supersedes the session: attempt 1 is lost
			second := s.nextAssign(m)
			if second.AttemptNumber != 2 || second.AttemptID == first.AttemptID {
				t.Fatalf("second assignment %+v", second)
			}
			s.reject(m, first, true, "stale")
			if j := s.status(id); j.State != protocol.StateRunning {
				t.Fatalf("stale result moved the job to %s", j.State)
			}
			s.accept(m, second, true, "fresh")
			j := s.status(id)
			if j.State != protocol.StateCompleted || deref(j.Result) != "fresh" || deref(j.Error) != "worker w1 lost (worker re-registered)" {
				t.Fatalf("job %+v result %q error %q", j, deref(j.Result), deref(j.Error))
			}
		})
		t.Run("Duplicate", func(t *testing.T) {
			t.Parallel()
			s := setup(t, tr)
			m := s.manualWorker("w1", 1)
			id := s.submit("SHA256", text("x"))
			a := s.nextAssign(m)
			s.accept(m, a, true, "one")
			s.reject(m, a, false, "two")
			if j := s.status(id); j.State != protocol.StateCompleted || deref(j.Result) != "one" || j.Error != nil {
				t.Fatalf("job %+v", j)
			}
		})
		t.Run("MidRetry", func(t *testing.T) {
			t.Parallel()
			s := setup(t, tr, func(c *coordinator.Config) { c.RetryBaseDelay, c.RetryMaxDelay = time.Hour, time.Hour })
			m := s.manualWorker("w1", 1)
			id := s.submit("SHA256", text("x"))
			a := s.nextAssign(m)
			s.accept(m, a, false, "boom")
			s.reject(m, a, true, "late success")
			if j := s.status(id); j.State != protocol.StateRetryWait || deref(j.Error) != "boom" || j.Result != nil {
				t.Fatalf("job %+v", j)
			}
		})
	})
}

func TestDeadline(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		s := setup(t, tr, func(c *coordinator.Config) { c.TaskTimeout = 100 * time.Millisecond })
		m := s.manualWorker("slow", 1)
		id := s.submit("SLEEP", map[string]int{"durationMillis": 30000}, client.MaxAttempts(1))
		a := s.nextAssign(m)
		c := s.nextCancel(m)
		if c.JobID != a.JobID || c.AttemptID != a.AttemptID {
			t.Fatalf("cancel %+v for assignment %+v", c, a)
		}
		j := s.waitState(id, protocol.StateFailed)
		if want := "execution deadline exceeded (100 ms) on worker slow (all 1 attempts used)"; deref(j.Error) != want {
			t.Fatalf("error %q, want %q", deref(j.Error), want)
		}
		s.reject(m, a, true, "too late")
	})
}

func TestCancel(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		s := setup(t, tr)
		w, stopWorker := s.startWorker(1)
		ctx := context.Background()

		running := s.submit("SLEEP", map[string]int{"durationMillis": 30000})
		s.waitState(running, protocol.StateRunning)
		queued := s.submit("SHA256", text("waits behind the sleep"))
		start := time.Now()
		ok, j, err := s.client.Cancel(ctx, running)
		must(t, err)
		if !ok || j.State != protocol.StateCancelled || deref(j.Error) != "cancelled by client request" || j.WorkerID != nil {
			t.Fatalf("cancel running: %v %+v", ok, j)
		}
		// The slot is free again: the queued job runs on the same single-slot worker.
		if j := s.wait(queued); j.State != protocol.StateCompleted {
			t.Fatalf("queued job %+v", j)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("30 s sleep cancelled and slot reused after %v", took)
		}
		s.eventually("the sleep attempt ends on the worker", func() bool { return w.Running() == 0 })
		if j := s.status(running); j.State != protocol.StateCancelled {
			t.Fatalf("the cancelled job's late result changed it: %+v", j)
		}

		again, j, err := s.client.Cancel(ctx, running)
		must(t, err)
		if again || j.State != protocol.StateCancelled {
			t.Fatalf("second cancel: %v %+v", again, j)
		}
		done, j, err := s.client.Cancel(ctx, queued)
		must(t, err)
		if done || j.State != protocol.StateCompleted {
			t.Fatalf("cancel of a completed job: %v %+v", done, j)
		}

		// A QUEUED job cancels too, and never runs.
		stopWorker()
		busy := s.manualWorker("busy", 1)
		s.submit("SLEEP", map[string]int{"durationMillis": 30000})
		s.nextAssign(busy)
		id := s.submit("SHA256", text("q"))
		ok, j, err = s.client.Cancel(ctx, id)
		must(t, err)
		if !ok || j.State != protocol.StateCancelled || j.Attempts != 0 {
			t.Fatalf("cancel queued: %v %+v", ok, j)
		}
	})
}

func TestCancelRetryWait(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		s := setup(t, tr, func(c *coordinator.Config) { c.RetryBaseDelay, c.RetryMaxDelay = time.Hour, time.Hour })
		m := s.manualWorker("w", 1)
		id := s.submit("SHA256", text("x"))
		s.accept(m, s.nextAssign(m), false, "boom")
		ok, j, err := s.client.Cancel(context.Background(), id)
		must(t, err)
		if !ok || j.State != protocol.StateCancelled || deref(j.Error) != "cancelled by client request" {
			t.Fatalf("cancel in RETRY_WAIT: %v %+v", ok, j)
		}
	})
}

func TestSchedulingSafety(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		s := setup(t, tr)
		var workers []peer
		for i := range 5 {
			workers = append(workers, s.manualWorker(fmt.Sprintf("w%d", i), 4))
		}
		var mu sync.Mutex
		submitted := map[string]bool{}
		var wg sync.WaitGroup
		for c := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 15 {
					id, err := s.client.Submit(context.Background(), "SHA256", text(fmt.Sprintf("%d-%d", c, i)))
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
				case a := <-w.assignments():
					progress = true
					assigned[a.JobID]++
					if a.AttemptNumber != 1 {
						t.Errorf("job %s assigned on attempt %d", a.JobID, a.AttemptNumber)
					}
					s.accept(w, a, true, "ok")
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
			if len(w.assignments()) != 0 {
				t.Errorf("worker %s got an extra assignment", w.ID())
			}
		}
	})
}

func TestAdmissionControl(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		t.Run("RejectsAtLimit", func(t *testing.T) {
			t.Parallel()
			s := setup(t, tr, func(c *coordinator.Config) { c.MaxActiveJobs = 5 })
			for range 5 {
				s.submit("SHA256", text("x"))
			}
			_, err := s.client.Submit(context.Background(), "SHA256", text("x"))
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
			_, err = s.client.Submit(context.Background(), "SHA256", text("x"))
			if !errors.As(err, &rej) || rej.ActiveCount != 5 || rej.Limit != 3 {
				t.Fatalf("after restart: %v %+v", err, rej)
			}
			// Finishing work makes room again; retries are never re-admitted.
			s.startWorker(4)
			s.eventually("room again", func() bool {
				_, err := s.client.Submit(context.Background(), "FAIL", map[string]int{"failUntilAttempt": 2})
				return err == nil
			})
		})
		t.Run("ExactUnderRacingClients", func(t *testing.T) {
			t.Parallel()
			s := setup(t, tr, func(c *coordinator.Config) { c.MaxActiveJobs = 20 })
			var accepted, rejected sync.WaitGroup
			var mu sync.Mutex
			ok, no := 0, 0
			for range 8 {
				accepted.Add(1)
				go func() {
					defer accepted.Done()
					for range 10 {
						_, err := s.client.Submit(context.Background(), "SHA256", text("x"))
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
	})
}

func TestIdempotency(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		s := setup(t, tr, func(c *coordinator.Config) { c.MaxActiveJobs = 1 })
		ctx := context.Background()
		var wg sync.WaitGroup
		ids := make([]string, 8)
		for i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id, err := s.client.Submit(ctx, "SHA256", rawJSON(`{"text":"a","extra":[1,2]}`), client.IdempotencyKey("k1"))
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
		same, err := s.client.Submit(ctx, "SHA256", rawJSON(`{ "extra":[1,2], "text":"a" }`),
			client.IdempotencyKey("k1"), client.Priority(protocol.PriorityNormal), client.MaxAttempts(3))
		must(t, err)
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
				_, err := s.client.Submit(ctx, c.task, rawJSON(c.body), append(c.opts, client.IdempotencyKey("k1"))...)
				want := fmt.Sprintf("Idempotency key 'k1' is already bound to a different submission (job %s)", ids[0])
				if !errors.Is(err, client.ErrServer) || err.Error() != want {
					t.Fatalf("err %v, want %q", err, want)
				}
			})
		}
		// Terminal jobs keep their key; the binding survives a restart.
		_, _, err = s.client.Cancel(ctx, ids[0])
		must(t, err)
		s.RestartCoordinator(t)
		again, err := s.client.Submit(ctx, "SHA256", rawJSON(`{"text":"a","extra":[1,2]}`), client.IdempotencyKey("k1"))
		must(t, err)
		if again != ids[0] {
			t.Fatalf("after restart the key gave job %s, want %s", again, ids[0])
		}
		page, err := s.client.List(ctx, protocol.ListJobs{})
		must(t, err)
		if len(page.Jobs) != 1 {
			t.Fatalf("%d jobs exist, want 1", len(page.Jobs))
		}
	})
}
