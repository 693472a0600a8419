package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
)

// TestOversizedTextsEndTheJob: a handler's result, or error, longer than a NATS message
// holds (2 MiB, the server's limit 1 MiB) still ends its job on its first attempt, with
// the text cut as the coordinator cuts every text longer than protocol.MaxTextBytes.
// Before, the worker offered a result NATS refused to publish again and again: the job
// stayed RUNNING until its execution deadline and then ran again.
func TestOversizedTextsEndTheJob(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	big := strings.Repeat("x", 2<<20)
	w, _ := sys.StartFunctionWorker(t, func(w *worker.Worker) error {
		return errors.Join(
			w.Handle("BIG_RESULT", func(context.Context, int, json.RawMessage) (string, error) { return big, nil }),
			w.Handle("BIG_ERROR", func(context.Context, int, json.RawMessage) (string, error) {
				return "", worker.Permanent(errors.New(big))
			}),
		)
	})
	cl := client.New(sys.NC)
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	ok, err := cl.Submit(context.Background(), "BIG_RESULT", json.RawMessage(`{}`))
	must(t, err)
	failed, err := cl.Submit(context.Background(), "BIG_ERROR", json.RawMessage(`{}`))
	must(t, err)
	// Well within the coordinator's 10 s task timeout.
	testkit.Eventually(t, 5*time.Second, "both jobs ended", func() bool {
		return jobState(t, cl, ok).State == protocol.StateCompleted && jobState(t, cl, failed).State == protocol.StateFailed
	})
	for _, id := range []string{ok, failed} {
		j := jobState(t, cl, id)
		text := deref(j.Result)
		if j.State == protocol.StateFailed {
			text = deref(j.Error)
		}
		// A failure's text goes on to say which attempt failed.
		if j.Attempts != 1 || len(text) > protocol.MaxTextBytes+100 || !strings.Contains(text, "x... (truncated)") {
			t.Errorf("job %s: %s after %d attempts, text of %d bytes ending %q; want 1 attempt, about %d bytes, truncated",
				id, j.State, j.Attempts, len(text), text[max(0, len(text)-40):], protocol.MaxTextBytes)
		}
	}
}

// TestShutdownKeepsHeartbeatingWhileResultsGo: a worker whose Run ends while a handler
// that does not watch its context still works (1.5 s, past the coordinator's 400 ms
// heartbeat timeout, within the worker's shutdown timeout) delivers the handler's
// result, and the job is COMPLETED on its one attempt. Before, the worker stopped
// heartbeating as its shutdown began: the coordinator lost it with the attempt, and the
// job FAILED (worker lost) though its result came moments later.
func TestShutdownKeepsHeartbeatingWhileResultsGo(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	started := make(chan struct{}, 1)
	w, stop := sys.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("CRUNCH", func(context.Context, int, json.RawMessage) (string, error) {
			started <- struct{}{}
			time.Sleep(1500 * time.Millisecond) // the handler's work, which does not watch its context
			return "crunched", nil
		})
	}, worker.WithShutdownTimeout(10*time.Second))
	cl := client.New(sys.NC)
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	id, err := cl.Submit(context.Background(), "CRUNCH", json.RawMessage(`{}`), client.MaxAttempts(1))
	must(t, err)
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("handler not started")
	}
	stop() // returns once Run has: the result delivered, the goodbye said
	testkit.Eventually(t, 10*time.Second, "job ended", func() bool {
		s := jobState(t, cl, id).State
		return s == protocol.StateCompleted || s == protocol.StateFailed
	})
	if j := jobState(t, cl, id); j.State != protocol.StateCompleted || j.Attempts != 1 || deref(j.Result) != "crunched" {
		t.Errorf("job %s after %d attempts, result %q, error %q; want COMPLETED after 1 with its result",
			j.State, j.Attempts, deref(j.Result), deref(j.Error))
	}
}

// nilErr is an error type whose methods use their receiver, so a nil *nilErr returned as
// an error panics when asked its text: Go's typed nil in a non-nil interface.
type nilErr struct{ msg string }

func (e *nilErr) Error() string { return e.msg }

// TestTypedNilErrorFailsOnlyItsAttempt: a handler that returns a nil *T as its error
// (an interface that is not nil, whose Error panics) fails its attempt as a panic in
// the handler does; the worker, and the attempts it runs beside it, go on. Before, the
// panic came when the worker wrote the attempt's result, outside the handler's
// recover, and took the whole worker process down.
func TestTypedNilErrorFailsOnlyItsAttempt(t *testing.T) {
	t.Parallel()
	f := setup(t, setupConfig{handle: func(w *worker.Worker) error {
		return w.Handle("TYPED_NIL", func(context.Context, int, json.RawMessage) (string, error) {
			var e *nilErr
			return "", e
		})
	}})
	f.waitRegistered(t, 1)
	f.coord.assign(t, f.w.ID(), "job-nil", "a1", "TYPED_NIL", `{}`)
	if r := f.coord.result(t, "job-nil", "a1"); r.Success || !strings.Contains(deref(r.Error), "panicked") {
		t.Errorf("result = %+v (error %q), want a failure saying the task panicked", r, deref(r.Error))
	}
	f.coord.assign(t, f.w.ID(), "job-after", "a1", "WORD_COUNT", `{"text":"a b c"}`)
	if r := f.coord.result(t, "job-after", "a1"); deref(r.Result) != "3" {
		t.Errorf("result after = %+v", r)
	}
}

// TestStoppingWorkerIsAssignedNothing: a worker whose Run ends (no Drain first, as a
// program that only cancels Run's context) tells the coordinator to assign it nothing
// more, so a job submitted while it stops waits for another worker and runs there on
// its first attempt. Before, the coordinator, hearing its heartbeats and seeing a free
// slot, assigned the job to it; the stopping worker dropped the assignment, and its
// goodbye counted the attempt: the job FAILED (max attempts 1) without ever running.
func TestStoppingWorkerIsAssignedNothing(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	started := make(chan struct{}, 1)
	l := &logs{}
	w, stop := sys.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("CRUNCH", func(context.Context, int, json.RawMessage) (string, error) {
			started <- struct{}{}
			time.Sleep(1500 * time.Millisecond) // the handler's work, which does not watch its context
			return "crunched", nil
		})
	}, worker.WithCapacity(2), worker.WithLogger(slog.New(l.handler())))
	cl := client.New(sys.NC)
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	crunch, err := cl.Submit(context.Background(), "CRUNCH", json.RawMessage(`{}`), client.MaxAttempts(1))
	must(t, err)
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("handler not started")
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		stop()
	}()
	testkit.Eventually(t, 10*time.Second, "worker stopping", func() bool { return l.has("worker stopping") })
	// The stopping worker has a free slot, and keeps heartbeating while CRUNCH works.
	later, err := cl.Submit(context.Background(), "WORD_COUNT", json.RawMessage(`{"text":"a b"}`), client.MaxAttempts(1))
	must(t, err)
	<-stopped
	sys.StartNativeWorker(t)
	testkit.Eventually(t, 15*time.Second, "both jobs ended", func() bool {
		return final(jobState(t, cl, crunch).State) && final(jobState(t, cl, later).State)
	})
	if j := jobState(t, cl, crunch); j.State != protocol.StateCompleted {
		t.Errorf("the job that ran as the worker stopped: %s, error %q", j.State, deref(j.Error))
	}
	if j := jobState(t, cl, later); j.State != protocol.StateCompleted || j.Attempts != 1 {
		t.Errorf("job submitted while the worker stopped: %s after %d attempts, error %q; want COMPLETED after 1",
			j.State, j.Attempts, deref(j.Error))
	}
}

func final(s protocol.State) bool {
	return s == protocol.StateCompleted || s == protocol.StateFailed || s == protocol.StateCancelled
}

// TestRegistrationTooLargeFailsRun: a worker whose registration does not fit in a NATS
// message (task types whose schemas add up to more than the server's 1 MiB maximum
// payload) ends Run at once with an error that names the registration's size and the
// limit. Before, NATS refused to send it, the worker took that for a coordinator not
// answering, and Run retried for ever, logging only that it was waiting.
func TestRegistrationTooLargeFailsRun(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	limit := sys.NC.MaxPayload()
	description := strings.Repeat("d", int(limit)/3)
	schema := json.RawMessage(`{"type":"object","description":"` + description + `"}`)
	w, err := worker.New(sys.NC, worker.WithLogger(nil))
	must(t, err)
	t.Cleanup(func() { _ = w.Close() })
	for i := range 4 { // each schema fits; together they do not
		must(t, w.Handle(fmt.Sprintf("BIG_SCHEMA_%d", i), func(context.Context, int, json.RawMessage) (string, error) { return "", nil },
			worker.Schema(schema)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = w.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run was still registering after 10 s (returned %v), want it to fail at once", err)
	}
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("maximum payload on this server is %d bytes", limit)) ||
		!regexp.MustCompile(`registration \(\d{7} bytes, 9 task types\)`).MatchString(err.Error()) {
		t.Fatalf("Run: %v, want an error naming the registration's size and the limit (%d bytes)", err, limit)
	}
	t.Log(err)
}

// TestGoodbyeLandsBeforeTheRestart: a worker of a fixed id stopped and started again at
// once (a restart with --id), whose old process reaches NATS over a slow path (half a
// second each way of its sending), keeps its new registration: a job submitted as it
// comes back runs on it and COMPLETES on its one attempt. Before, the old process's
// goodbye was a tell: its Run returned as it was sent, the new registration overtook it,
// and the goodbye, landing after, lost the new registration and the job with it
// (FAILED, worker lost (worker shutting down)).
func TestGoodbyeLandsBeforeTheRestart(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	proxy := testkit.NewProxy(t, strings.TrimPrefix(sys.Server.ClientURL(), "nats://"))
	const id = "restarted"
	old, err := worker.Connect(context.Background(), "nats://"+proxy.Addr(),
		worker.WithID(id), worker.WithHeartbeat(time.Second), worker.WithLogger(nil))
	must(t, err)
	t.Cleanup(func() { _ = old.Close() })
	stopOld := jobbustest.Go(t, old.Run)
	cl := client.New(sys.NC)
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, id) })
	proxy.Delay(500 * time.Millisecond)
	stopOld()
	_ = old.Close()
	sys.StartNativeWorker(t, worker.WithID(id)) // the restart, over a fast path
	job, err := cl.Submit(context.Background(), "SLEEP", json.RawMessage(`{"durationMillis":1500}`), client.MaxAttempts(1))
	must(t, err)
	testkit.Eventually(t, 15*time.Second, "job ended", func() bool { return final(jobState(t, cl, job).State) })
	if j := jobState(t, cl, job); j.State != protocol.StateCompleted || j.Attempts != 1 {
		t.Errorf("job %s after %d attempts, error %q; want COMPLETED after 1 on the restarted worker",
			j.State, j.Attempts, deref(j.Error))
	}
}
