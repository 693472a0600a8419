package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/jobbustest/suite"
	"github.com/jobbus/jobbus/worker"
)

// registerWith registers a raw worker with capacity slots and returns the answer.
func (w *rawWorker) registerWith(capacity int) protocol.WorkerRegistered {
	w.t.Helper()
	ans, err := bus.Ask[protocol.WorkerRegistered](context.Background(), w.node, coordinatorAddr, protocol.PathRegister,
		&protocol.WorkerRegister{WorkerID: w.id, Capacity: capacity, Instance: "p1"})
	must(w.t, err)
	return ans
}

// reportBatch asks a batch of results (PathResults) and returns its answers.
func (w *rawWorker) reportBatch(results ...*protocol.TaskResult) []protocol.ResultAnswer {
	w.t.Helper()
	req := &protocol.TaskResults{WorkerID: w.id}
	for _, r := range results {
		req.Results = append(req.Results, *r)
	}
	acks, err := bus.Ask[protocol.ResultAcks](context.Background(), w.node, coordinatorAddr, protocol.PathResults, req)
	must(w.t, err)
	if len(acks.Acks) != len(results) {
		w.t.Fatalf("a batch of %d results got %d answers: %+v", len(results), len(acks.Acks), acks.Acks)
	}
	return acks.Acks
}

// TestResultBatchAnswersEachResult: one batch carries an accepted result, a stale one
// (not the attempt's lease), one for another worker's attempt and one that speaks for
// another worker; each gets its own answer, as it would alone, and only the accepted
// one changes its job.
func TestResultBatchAnswersEachResult(t *testing.T) {
	t.Parallel()
	s := setup(t)
	w1, w2 := newRawWorker(t, s, "w1"), newRawWorker(t, s, "w2")
	if ans := w1.registerWith(2); ans.Results != protocol.MaxResults {
		t.Fatalf("registration answered Results %d, want %d: the coordinator must say it takes batches", ans.Results, protocol.MaxResults)
	}
	id1 := s.Submit("SHA256", text("one"))
	a1 := w1.nextAssign()
	id2 := s.Submit("SHA256", text("two"))
	a2 := w1.nextAssign()
	w2.registerWith(1)
	id3 := s.Submit("SHA256", text("three"))
	a3 := w2.nextAssign()
	if a1.JobID != id1 || a2.JobID != id2 || a3.JobID != id3 {
		t.Fatalf("assignments %s %s %s, want %s %s %s", a1.JobID, a2.JobID, a3.JobID, id1, id2, id3)
	}

	stale := a2
	stale.AttemptID = "not-the-lease"
	asW2 := suite.Result("w2", a3, true, "spoken for w2")
	answers := w1.reportBatch(
		suite.Result("w1", a1, true, "done"),
		suite.Result("w1", stale, true, "stale"),
		suite.Result("w1", a3, true, "not mine"),
		asW2,
	)
	if a := answers[0]; a.JobID != id1 || !a.Accepted || a.Code != 0 {
		t.Errorf("the accepted result's answer %+v", a)
	}
	if a := answers[1]; a.JobID != id2 || a.Accepted || a.Code != 0 {
		t.Errorf("the stale result's answer %+v, want not accepted and no error", a)
	}
	for _, a := range answers[2:] {
		if a.JobID != id3 || a.Accepted || a.Code != int(bus.CodeForbidden) || a.Error == "" {
			t.Errorf("another worker's result's answer %+v, want 403 with a reason", a)
		}
	}
	if j := s.Wait(id1); j.State != protocol.StateCompleted || deref(j.Result) != "done" {
		t.Fatalf("job 1 %+v result %q, want COMPLETED with done", j, deref(j.Result))
	}
	for _, id := range []string{id2, id3} {
		if j := s.Status(id); j.State != protocol.StateRunning || j.Attempts != 1 {
			t.Fatalf("job %s %+v, want RUNNING on its first attempt: a refused or stale result changed it", id, j)
		}
	}
	// The attempts go on: their own workers' results count.
	if a := w1.reportBatch(suite.Result("w1", a2, true, "two done"))[0]; !a.Accepted {
		t.Errorf("w1's own result for job 2: %+v", a)
	}
	if ack := w2.report(a3, "three done"); !ack.Accepted {
		t.Errorf("w2's single result for job 3: %+v", ack)
	}
	for id, want := range map[string]string{id2: "two done", id3: "three done"} {
		if j := s.Wait(id); j.State != protocol.StateCompleted || deref(j.Result) != want {
			t.Fatalf("job %s %+v result %q, want COMPLETED with %q", id, j, deref(j.Result), want)
		}
	}
}

// TestResultBatchFromAnotherWorkerRefused: a batch that names another worker than its
// sender is refused whole, as a single result would be.
func TestResultBatchFromAnotherWorkerRefused(t *testing.T) {
	t.Parallel()
	s := setup(t)
	w1 := newRawWorker(t, s, "w1")
	w1.registerWith(1)
	s.Submit("SHA256", text("one"))
	a := w1.nextAssign()
	_, err := bus.Ask[protocol.ResultAcks](context.Background(), w1.node, coordinatorAddr, protocol.PathResults,
		&protocol.TaskResults{WorkerID: "w2", Results: []protocol.TaskResult{*suite.Result("w2", a, true, "x")}})
	if !errors403(err) {
		t.Fatalf("a batch sent by w1 for w2: err %v, want 403", err)
	}
}

func errors403(err error) bool {
	var re *bus.RemoteError
	return errors.As(err, &re) && re.Code == bus.CodeForbidden
}

// countAsks counts the asks sent to the coordinator role on path, from any worker.
func countAsks(t *testing.T, nc *nats.Conn, path string) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	sub, err := nc.Subscribe("jobbus.role.coordinator.worker.*."+path, func(*nats.Msg) { n.Add(1) })
	must(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	must(t, nc.Flush())
	return &n
}

// gate is a task that waits until it is opened, so that many attempts finish at once.
type gate struct {
	started atomic.Int64
	open    chan struct{}
}

func (g *gate) handle(w *worker.Worker) error {
	return worker.HandleJSON(w, "GATE", func(ctx context.Context, _ int, in struct {
		N int `json:"n"`
	}) (string, error) {
		g.started.Add(1)
		select {
		case <-g.open:
			return fmt.Sprintf("done %d", in.N), nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	})
}

// TestNativeWorkerBatchesResults: a worker whose many attempts finish at once
// delivers their results in fewer asks than results (group commit), and every job
// completes with its own result.
func TestNativeWorkerBatchesResults(t *testing.T) {
	t.Parallel()
	s := setup(t)
	const jobs = 48
	batches, singles := countAsks(t, s.NC, protocol.PathResults), countAsks(t, s.NC, protocol.PathResult)
	g := &gate{open: make(chan struct{})}
	s.StartFunctionWorker(t, g.handle, worker.WithCapacity(jobs))
	s.Eventually("the worker registered", func() bool { return len(s.Coordinator.Stats().Workers) == 1 })
	ids := make([]string, jobs)
	for i := range ids {
		ids[i] = s.Submit("GATE", map[string]int{"n": i})
	}
	s.Eventually("every attempt started", func() bool { return g.started.Load() == jobs })
	close(g.open)
	for i, id := range ids {
		if j := s.Wait(id); j.State != protocol.StateCompleted || deref(j.Result) != fmt.Sprintf("done %d", i) || j.Attempts != 1 {
			t.Fatalf("job %d %+v result %q, want COMPLETED on its first attempt", i, j, deref(j.Result))
		}
	}
	s.Eventually("every ask counted", func() bool { return batches.Load() > 0 })
	if n, one := batches.Load(), singles.Load(); n >= jobs || one != 0 {
		t.Fatalf("%d results went in %d batch asks and %d single ones, want fewer batch asks than results and no single ones", jobs, n, one)
	}
	t.Logf("%d results in %d asks", jobs, batches.Load())
}

// TestBatchedResultsOutliveARestart: results that finish while the coordinator is
// down are offered in batches that nobody answers (the test's subscription takes
// them, as a coordinator that died mid-way would), then to the restarted coordinator,
// which takes them: every job completes on its first attempt, none runs again.
func TestBatchedResultsOutliveARestart(t *testing.T) {
	t.Parallel()
	s := setup(t)
	const jobs = 16
	g := &gate{open: make(chan struct{})}
	s.StartFunctionWorker(t, g.handle, worker.WithCapacity(jobs),
		worker.WithResultRetry(10*time.Millisecond, 50*time.Millisecond), worker.WithBusOptions(bus.WithAskTimeout(200*time.Millisecond)))
	s.Eventually("the worker registered", func() bool { return len(s.Coordinator.Stats().Workers) == 1 })
	ids := make([]string, jobs)
	for i := range ids {
		ids[i] = s.Submit("GATE", map[string]int{"n": i})
	}
	s.Eventually("every attempt started", func() bool { return g.started.Load() == jobs })
	batches, singles := countAsks(t, s.NC, protocol.PathResults), countAsks(t, s.NC, protocol.PathResult)
	_ = s.Coordinator.Close()
	close(g.open)
	s.Eventually("results offered while no coordinator answers", func() bool { return batches.Load() >= 2 })
	before := batches.Load()
	s.StartCoordinator(t)
	for i, id := range ids {
		if j := s.Wait(id); j.State != protocol.StateCompleted || deref(j.Result) != fmt.Sprintf("done %d", i) || j.Attempts != 1 {
			t.Fatalf("job %d %+v result %q error %q, want COMPLETED on its first attempt", i, j, deref(j.Result), deref(j.Error))
		}
	}
	if g.started.Load() != jobs {
		t.Fatalf("%d attempts started, want %d: a job ran again", g.started.Load(), jobs)
	}
	if after, one := batches.Load(), singles.Load(); after == before || one != 0 {
		t.Fatalf("batch asks %d before the restart, %d in all; %d single ones: want the results in batches to the new coordinator", before, after, one)
	}
}
