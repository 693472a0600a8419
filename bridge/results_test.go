package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// resultAsks counts the asks carrying a worker's results, as a subscription sees them.
type resultAsks struct {
	mu      sync.Mutex
	batches int // asks on task.results
	batched int // the results they carried
	singles int // asks on task.result
}

// sniffResults counts the asks of worker id's results on paths from now on. A
// subscription counts as a responder to NATS: a path nobody serves must not be sniffed,
// or its asks would wait for an answer instead of finding nobody.
func sniffResults(t *testing.T, nc *nats.Conn, id string, paths ...string) *resultAsks {
	t.Helper()
	r := &resultAsks{}
	for _, path := range paths {
		sniff(t, nc, "jobbus.role.coordinator.worker."+id+"."+path, r.count(t, id))
	}
	return r
}

func sniff(t *testing.T, nc *nats.Conn, subject string, cb nats.MsgHandler) {
	t.Helper()
	sub, err := nc.Subscribe(subject, cb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func (r *resultAsks) count(t *testing.T, id string) nats.MsgHandler {
	return func(m *nats.Msg) {
		r.mu.Lock()
		defer r.mu.Unlock()
		switch {
		case strings.HasSuffix(m.Subject, "."+protocol.PathResult):
			r.singles++
		case strings.HasSuffix(m.Subject, "."+protocol.PathResults):
			var b protocol.TaskResults
			if err := json.Unmarshal(m.Data, &b); err != nil || b.WorkerID != id {
				t.Errorf("task.results %s (%v), want a batch of %s", m.Data, err, id)
			}
			r.batches++
			r.batched += len(b.Results)
		}
	}
}

func (r *resultAsks) seen() (batches, batched, singles int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.batches, r.batched, r.singles
}

// TestTCPWorkerResultsTravelInBatches: the results a TCP worker sends while earlier
// ones are being delivered go to the coordinator together, in fewer asks on
// task.results than results, and none on task.result; every job completes with its
// result, and the worker sees nothing in return, as the spec says.
func TestTCPWorkerResultsTravelInBatches(t *testing.T) {
	t.Parallel()
	s := setup(t)
	const jobs = 64
	for i := range jobs {
		if _, err := s.native.Submit(context.Background(), "SHA256", json.RawMessage(fmt.Sprintf(`{"text":"%d"}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	asks := sniffResults(t, s.NC, "tcp-results", protocol.PathResults, protocol.PathResult)
	w := s.worker("tcp-results", jobs)
	assigned := make([]*protocol.TaskAssign, jobs)
	for i := range assigned {
		a, ok := w.MustRecv().(*protocol.TaskAssign)
		if !ok {
			t.Fatalf("frame %d is not a TASK_ASSIGN", i)
		}
		assigned[i] = a
	}
	for i, a := range assigned { // back to back, as a busy worker finishes them
		w.MustSend(&protocol.TaskResult{WorkerID: "tcp-results", JobID: a.JobID, AttemptID: a.AttemptID, Success: true, Result: ptr(fmt.Sprint(i))})
	}
	for i, a := range assigned {
		if j := s.waitState(a.JobID, protocol.StateCompleted); deref(j.Result) != fmt.Sprint(i) || j.Attempts != 1 {
			t.Fatalf("job %+v, want COMPLETED with result %d", j, i)
		}
	}
	// The asks reach this subscription on a connection of its own: it may see the
	// last ones after their jobs completed.
	eventually(t, "every result sniffed", func() bool { _, batched, singles := asks.seen(); return batched+singles >= jobs })
	batches, batched, singles := asks.seen()
	t.Logf("%d results in %d asks", batched, batches)
	if singles != 0 || batched < jobs || batches >= jobs {
		t.Fatalf("%d results in %d asks on task.results and %d asks on task.result, want %d results in fewer asks, all batched",
			batched, batches, singles, jobs)
	}
	eventually(t, "every result answered", func() bool { return s.br.Stats().Results.Answered == jobs })
	// The spec's worker gets no answer to a result: nothing more comes on its connection.
	expectNothingQueued(t, w)
}

// expectNothingQueued proves that nothing is queued for the worker: a HEARTBEAT gets
// no answer either, so the next frame is the ERROR of a message a worker must not send.
func expectNothingQueued(t *testing.T, w *peer) {
	t.Helper()
	w.MustSend(&protocol.Heartbeat{WorkerID: "any"})
	if err := w.SendPayload([]byte(`{"type":"LIST_WORKERS"}`)); err != nil {
		t.Fatal(err)
	}
	w.ExpectErrorThenClosed(protocol.UnexpectedType(protocol.TypeListWorkers, "worker").Message)
}

// TestTCPWorkerLargeResult: a result that fits in a NATS message alone, but would not
// in a batch with the few bytes around it, is still delivered: it goes on its own.
func TestTCPWorkerLargeResult(t *testing.T) {
	t.Parallel()
	s := setup(t)
	id := strings.Repeat("w", protocol.MaxWorkerID)
	w := s.worker(id, 1)
	job, err := s.native.Submit(context.Background(), "SHA256", json.RawMessage(`{"text":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	a := w.ExpectAssign(job)
	res := &protocol.TaskResult{WorkerID: id, JobID: a.JobID, AttemptID: a.AttemptID, Success: true, Result: ptr("")}
	empty, err := protocol.Encode(res)
	if err != nil {
		t.Fatal(err)
	}
	*res.Result = strings.Repeat("r", protocol.MaxMessage-len(empty)) // a frame of the largest size
	w.MustSend(res)
	j := s.waitState(job, protocol.StateCompleted)
	if j.Result == nil || !strings.HasPrefix(*j.Result, "rrrr") {
		t.Fatalf("job %+v, want COMPLETED with the result, cut", j)
	}
}

// oldCoordinator plays a coordinator that serves no batches: it answers registrations
// (saying it takes batches of results, if claims, as a newer leader did before it),
// heartbeats, disconnects and single results, and assigns with single tells.
type oldCoordinator struct {
	node   *bus.Node
	claims bool

	mu      sync.Mutex
	regs    []protocol.WorkerRegister
	results map[string]int // by job id: how many times answered
}

func startOldCoordinator(t *testing.T, nc *nats.Conn, claims bool) *oldCoordinator {
	t.Helper()
	return startCoordinatorServing(t, nc, claims, false)
}

// startCoordinatorServing is startOldCoordinator, that also serves task.results if
// stall, by never answering (until its node closes).
func startCoordinatorServing(t *testing.T, nc *nats.Conn, claims, stall bool) *oldCoordinator {
	t.Helper()
	n, err := bus.New(nc, bus.Address{Role: bus.RoleCoordinator, ID: "old"}, bus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	c := &oldCoordinator{node: n, claims: claims, results: make(map[string]int)}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(bus.Handle(n, protocol.PathRegister, c.onRegister, bus.OnlyRole()))
	must(bus.Handle(n, protocol.PathHeartbeat, func(context.Context, bus.Address, protocol.Heartbeat) (protocol.HeartbeatAck, error) {
		return protocol.HeartbeatAck{}, nil
	}, bus.OnlyRole()))
	must(bus.Handle(n, protocol.PathDisconnect, func(context.Context, bus.Address, protocol.Disconnect) (struct{}, error) {
		return struct{}{}, nil
	}, bus.OnlyRole()))
	must(bus.Handle(n, protocol.PathResult, c.onResult, bus.OnlyRole()))
	if stall {
		must(n.Handle(protocol.PathResults, func(ctx context.Context, _ *bus.Request) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}, bus.OnlyRole()))
	}
	must(nc.Flush())
	return c
}

func (c *oldCoordinator) onRegister(_ context.Context, _ bus.Address, r protocol.WorkerRegister) (protocol.WorkerRegistered, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.regs = append(c.regs, r)
	ans := protocol.WorkerRegistered{WorkerID: r.WorkerID}
	if c.claims {
		ans.Results = protocol.MaxResults
	}
	return ans, nil
}

func (c *oldCoordinator) onResult(_ context.Context, _ bus.Address, r protocol.TaskResult) (protocol.ResultAck, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.results[r.JobID]++
	return protocol.ResultAck{JobID: r.JobID, Accepted: true}, nil
}

func (c *oldCoordinator) answered(job string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.results[job]
}

// TestTCPWorkerWithCoordinatorWithoutBatches: with a coordinator that serves no
// batches (an older one, whether or not a newer leader said it takes batches of
// results), the bridge still registers the worker as taking assignment batches, its
// single TASK_ASSIGNs reach the worker byte for byte, and every result is delivered
// on its own on task.result, each once.
func TestTCPWorkerWithCoordinatorWithoutBatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		claims bool
	}{{"NoResultsSaid", false}, {"ResultsSaidButNotServed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t, noCoordinator())
			old := startOldCoordinator(t, s.NC, tc.claims)
			id := "tcp-" + tc.name
			asks := sniffResults(t, s.NC, id, protocol.PathResult) // task.results is nobody's
			w := s.worker(id, 8)
			old.mu.Lock()
			reg := old.regs[0]
			old.mu.Unlock()
			if reg.Assigns != protocol.MaxAssigns || reg.Held == nil || len(reg.Held.Attempts) != 0 {
				t.Fatalf("registration %+v, want assigns %d and an empty held", reg, protocol.MaxAssigns)
			}
			const jobs = 8
			for i := range jobs {
				a := &protocol.TaskAssign{JobID: fmt.Sprintf("job-%d", i), AttemptID: fmt.Sprintf("att-%d", i), AttemptNumber: 1,
					TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`)}
				if err := old.node.Tell(context.Background(), bus.Address{Role: bus.RoleWorker, ID: id}, protocol.PathAssign, a); err != nil {
					t.Fatal(err)
				}
			}
			got := make(map[string]*protocol.TaskAssign, jobs)
			for range jobs {
				b, err := w.RecvRaw()
				if err != nil {
					t.Fatal(err)
				}
				var a protocol.TaskAssign
				if err := json.Unmarshal(b, &a); err != nil {
					t.Fatalf("frame %s: %v", b, err)
				}
				if want := fmt.Sprintf(`{"type":"TASK_ASSIGN","jobId":%q,"attemptId":%q,"attemptNumber":1,"taskType":"SHA256","payload":{"text":"x"}}`, a.JobID, a.AttemptID); string(b) != want {
					t.Fatalf("frame %s, want %s", b, want)
				}
				got[a.JobID] = &a
			}
			for _, a := range got {
				w.MustSend(&protocol.TaskResult{WorkerID: id, JobID: a.JobID, AttemptID: a.AttemptID, Success: true, Result: ptr("done")})
			}
			eventually(t, "every result answered", func() bool { return s.br.Stats().Results.Answered == jobs })
			for job := range got {
				if n := old.answered(job); n != 1 {
					t.Errorf("result of %s delivered %d times, want once", job, n)
				}
			}
			eventually(t, "every result's ask on task.result sniffed", func() bool { _, _, singles := asks.seen(); return singles >= jobs })
		})
	}
}

// TestTCPWorkerResultsGivenUpAfterResultRetryFor: results that a coordinator never
// answers are offered for ResultRetryFor, not longer, batched as they are.
func TestTCPWorkerResultsGivenUpAfterResultRetryFor(t *testing.T) {
	t.Parallel()
	s := setup(t, noCoordinator(), withBridge(func(c *bridgeConfig) {
		c.RequestTimeout = 100 * time.Millisecond
		c.ResultRetryFor = 500 * time.Millisecond
	}))
	startCoordinatorServing(t, s.NC, true, true)
	w := s.worker("tcp-unanswered", 4)
	const results = 4
	for i := range results {
		w.MustSend(&protocol.TaskResult{WorkerID: "tcp-unanswered", JobID: fmt.Sprintf("job-%d", i), AttemptID: "a", Success: true, Result: ptr("done")})
	}
	eventually(t, "every result abandoned", func() bool { return s.br.Stats().Results.Abandoned == results })
	if st := s.br.Stats().Results; st.Answered != 0 || st.Refused != 0 {
		t.Fatalf("results %+v, want all abandoned", st)
	}
}

// TestTCPWorkerResultOutlivesCoordinatorRestart: a result sent while no coordinator
// runs is offered again (nobody serves task.results, nor task.result) until the next
// coordinator takes it, in a batch: the job completes with it, on its first attempt.
func TestTCPWorkerResultOutlivesCoordinatorRestart(t *testing.T) {
	t.Parallel()
	s := setup(t, withBridge(func(c *bridgeConfig) { c.ResultRetryFor = waitFor }))
	w := s.worker("tcp-restart", 2)
	id, err := s.native.Submit(context.Background(), "SHA256", json.RawMessage(`{"text":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	a := w.ExpectAssign(id)
	if err := s.Coordinator.Close(); err != nil {
		t.Fatal(err)
	}
	w.MustSend(&protocol.TaskResult{WorkerID: "tcp-restart", JobID: id, AttemptID: a.AttemptID, Success: true, Result: ptr("after")})
	asks := sniffResults(t, s.NC, "tcp-restart", protocol.PathResult) // task.results is nobody's now
	eventually(t, "the result offered while no coordinator runs", func() bool { _, _, n := asks.seen(); return n > 0 })
	s.StartCoordinator(t)
	if j := s.waitState(id, protocol.StateCompleted); deref(j.Result) != "after" || j.Attempts != 1 {
		t.Fatalf("job %+v, want COMPLETED on its first attempt with the result sent meanwhile", j)
	}
	eventually(t, "the result answered", func() bool { return s.br.Stats().Results.Answered == 1 })
}

// TestTCPWorkerResultOutlivesItsSupersededConnection: a spec worker sends its result
// while no coordinator serves (a restart, a failover), then registers again on a new
// connection before the bridge has seen the old one end (a half-open connection, a
// quick redial). The new connection reports holding nothing, which loses every attempt
// of the worker still open, so it must not reach the coordinator before the result read
// on the old one: the job completes with that result, on its only attempt. Before, a
// superseded session let its successor register at once: the next coordinator counted
// the attempt lost, and the job failed although its result was in the bridge's hands.
func TestTCPWorkerResultOutlivesItsSupersededConnection(t *testing.T) {
	t.Parallel()
	s := setup(t, withBridge(func(c *bridgeConfig) { c.RequestTimeout, c.ResultRetryFor = waitFor, waitFor }))
	old := s.worker("twin", 1)
	id, err := s.native.Submit(context.Background(), "SHA256", json.RawMessage(`{"text":"x"}`), client.MaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	a := old.ExpectAssign(id)
	if err := s.Coordinator.Close(); err != nil {
		t.Fatal(err)
	}
	// A stand-in answers the result's offers as a coordinator that is not serving
	// yet (503: offer it again), so the test sees it offered.
	standIn, err := bus.New(s.NC, bus.Address{Role: bus.RoleCoordinator, ID: "stand-in"})
	if err != nil {
		t.Fatal(err)
	}
	defer standIn.Close()
	var offers atomic.Int64
	notServing := func(context.Context, bus.Address, json.RawMessage) (struct{}, error) {
		offers.Add(1)
		return struct{}{}, bus.Errorf(bus.CodeUnavailable, "not serving yet")
	}
	for _, path := range []string{protocol.PathResults, protocol.PathResult} {
		if err := bus.Handle(standIn, path, notServing, bus.AsRole()); err != nil {
			t.Fatal(err)
		}
	}
	old.MustSend(&protocol.TaskResult{WorkerID: "twin", JobID: id, AttemptID: a.AttemptID, Success: true, Result: ptr("first")})
	eventually(t, "the result offered", func() bool { return offers.Load() > 0 })

	fresh := dial(t, s.br.WorkerAddr())
	fresh.MustSend(&protocol.WorkerRegister{WorkerID: "twin", Capacity: 1})
	old.ExpectClosed() // superseded, while its result is still on its way
	if err := standIn.Close(); err != nil {
		t.Fatal(err)
	}
	s.StartCoordinator(t)
	if m, ok := fresh.MustRecv().(*protocol.WorkerRegistered); !ok {
		t.Fatalf("got %+v, want WORKER_REGISTERED", m)
	}
	var j protocol.Job
	eventually(t, "job "+id+" ended", func() bool { j = s.job(id); return j.State.Terminal() })
	if j.State != protocol.StateCompleted || j.Attempts != 1 || deref(j.Result) != "first" {
		t.Fatalf("job %s after %d attempts, result %q, error %q: want COMPLETED with the result sent before the new connection",
			j.State, j.Attempts, deref(j.Result), deref(j.Error))
	}
}

// TestTCPWorkerResultOutlastingRequestTimeout: a spec worker sends its result while no
// coordinator serves for longer than the bridge's RequestTimeout (a failover, a
// restart), and dials again, after closing its connection or leaving it half-open. The
// new connection reports holding nothing, and an ended one is reported lost: either
// would lose the attempt, so neither may reach the coordinator before the result read
// earlier, however long its relay takes within ResultRetryFor. The job completes with
// that result, on its only attempt. Before, the bridge waited one RequestTimeout for the
// result and then let the loss through: the coordinator counted the attempt lost and
// the job failed, although its result was in the bridge's hands.
func TestTCPWorkerResultOutlastingRequestTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		closeOld bool
	}{{"OldConnectionClosed", true}, {"OldConnectionHalfOpen", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const requestTimeout = 200 * time.Millisecond
			s := setup(t, withBridge(func(c *bridgeConfig) { c.RequestTimeout, c.ResultRetryFor = requestTimeout, waitFor }))
			id := "slow-relay-" + tc.name
			old := s.worker(id, 1)
			job, err := s.native.Submit(context.Background(), "SHA256", json.RawMessage(`{"text":"x"}`), client.MaxAttempts(1))
			if err != nil {
				t.Fatal(err)
			}
			a := old.ExpectAssign(job)
			if err := s.Coordinator.Close(); err != nil {
				t.Fatal(err)
			}
			offers := timeOffers(t, s.NC, id)
			old.MustSend(&protocol.TaskResult{WorkerID: id, JobID: job, AttemptID: a.AttemptID, Success: true, Result: ptr("first")})
			if tc.closeOld {
				_ = old.Close()
			}
			// The relay outlasts a request: the result is still offered well after one
			// RequestTimeout, and no coordinator has answered it.
			eventually(t, "the result offered past the request timeout", func() bool { return offers.since(time.Time{}) > 2*requestTimeout })
			fresh := dial(t, s.br.WorkerAddr())
			fresh.MustSend(&protocol.WorkerRegister{WorkerID: id, Capacity: 1})
			sent := time.Now()
			eventually(t, "the result offered past the request timeout after the new registration", func() bool {
				return offers.since(sent) > 2*requestTimeout
			})
			s.StartCoordinator(t)
			registerAgainUntilRegistered(t, s, fresh, id)
			var j protocol.Job
			eventually(t, "job "+job+" ended", func() bool { j = s.job(job); return j.State.Terminal() })
			if j.State != protocol.StateCompleted || j.Attempts != 1 || deref(j.Result) != "first" {
				t.Fatalf("job %s after %d attempts, result %q, error %q: want COMPLETED with the result sent before the new connection",
					j.State, j.Attempts, deref(j.Result), deref(j.Error))
			}
		})
	}
}

// offerTimes records when a worker's results were offered on task.result (task.results
// is nobody's while no coordinator runs, so the bridge offers them singly).
type offerTimes struct {
	mu          sync.Mutex
	first, last time.Time
}

func timeOffers(t *testing.T, nc *nats.Conn, id string) *offerTimes {
	t.Helper()
	o := &offerTimes{}
	sniff(t, nc, "jobbus.role.coordinator.worker."+id+"."+protocol.PathResult, func(*nats.Msg) {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.first.IsZero() {
			o.first = time.Now()
		}
		o.last = time.Now()
	})
	return o
}

// since is how long after t (or after the first offer, if t is zero) the last offer
// was seen; 0 if none was.
func (o *offerTimes) since(t time.Time) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	if t.IsZero() {
		t = o.first
	}
	if o.last.IsZero() {
		return 0
	}
	return o.last.Sub(t)
}

// registerAgainUntilRegistered plays a spec worker whose registration on p is pending:
// on ERROR (no coordinator answered it) it dials again and registers anew, until one
// connection gets WORKER_REGISTERED.
func registerAgainUntilRegistered(t *testing.T, s *system, p *peer, id string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		m, err := p.Recv()
		if _, ok := m.(*protocol.WorkerRegistered); ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker %s not registered: last got %+v (%v)", id, m, err)
		}
		t.Logf("registration answered %+v (%v); dialling again", m, err)
		_ = p.Close()
		p = dial(t, s.br.WorkerAddr())
		p.MustSend(&protocol.WorkerRegister{WorkerID: id, Capacity: 1})
	}
}
