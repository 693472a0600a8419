package coordinator

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/embeddednats"
)

// stalledStore is a JetStream store whose job writes, once stall is called, wait until
// release is closed: a stream without a quorum, or a disk with no room, as the
// committer sees it.
type stalledStore struct {
	jobStore
	mu      sync.Mutex
	stalled bool
	release chan struct{}
}

func (s *stalledStore) stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalled = true
}

func (s *stalledStore) write(ctx context.Context, ws []pendingWrite) bool {
	s.mu.Lock()
	stalled := s.stalled
	s.mu.Unlock()
	if stalled {
		select {
		case <-s.release:
		case <-ctx.Done():
		}
	}
	return s.jobStore.write(ctx, ws)
}

// TestResultsWaitingForAStalledStoreLeaveHeartbeatsServed: while the store stalls,
// more results wait for their writes than the coordinator's bus node has handler slots
// (bus.DefaultMaxInFlight); heartbeats and registrations are still answered, so the
// coordinator loses no worker, and none of the attempts they run, to the store's
// trouble. Each result's handler waits for its write, and they took every slot: the
// heartbeats waited behind them, unanswered, until the workers were lost.
func TestResultsWaitingForAStalledStoreLeaveHeartbeatsServed(t *testing.T) {
	t.Parallel()
	const (
		jobs       = bus.DefaultMaxInFlight + 44
		beatWithin = time.Second
	)
	ctx := context.Background()
	srv, err := embeddednats.Start(ctx, embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()))
	must(t, err)
	t.Cleanup(func() { _ = srv.Shutdown(ctx) })
	nc, err := srv.Connect()
	must(t, err)
	t.Cleanup(nc.Close)

	cfg := DefaultConfig()
	cfg.HeartbeatTimeout = 2 * time.Second
	must(t, cfg.Validate())
	cfg.fill()
	c := &Coordinator{cfg: cfg}
	st := &stalledStore{jobStore: newJetStreamStore(nc, &c.cfg), release: make(chan struct{})}
	c.build(nc, st)
	must(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Close() })
	t.Cleanup(func() { close(st.release) }) // first: the results' writes land, then Close

	wnc, err := srv.Connect()
	must(t, err)
	t.Cleanup(wnc.Close)
	node, err := bus.New(wnc, bus.Address{Role: bus.RoleWorker, ID: "w"}, bus.WithLogger(nil), bus.WithAskTimeout(beatWithin))
	must(t, err)
	t.Cleanup(func() { _ = node.Close() })
	assigns := make(chan protocol.TaskAssign, jobs+1)
	must(t, bus.Handle(node, protocol.PathAssign, func(_ context.Context, _ bus.Address, a protocol.TaskAssign) (struct{}, error) {
		assigns <- a
		return struct{}{}, nil
	}))
	coordinator := bus.Address{Role: bus.RoleCoordinator}
	_, err = bus.Ask[protocol.WorkerRegistered](ctx, node, coordinator, protocol.PathRegister,
		&protocol.WorkerRegister{WorkerID: "w", Capacity: jobs + 1, Instance: "p1"})
	must(t, err)
	beats := heartbeating(t, node, "w", 200*time.Millisecond)

	for i := range jobs + 1 {
		c.sched.submit(sha(fmt.Sprint("job ", i)), request{due: cfg.ReplyWithin}, func(protocol.Message) {})
	}
	running := make([]protocol.TaskAssign, 0, jobs+1)
	for len(running) < jobs+1 {
		select {
		case a := <-assigns:
			running = append(running, a)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d jobs of %d assigned", len(running), jobs+1)
		}
	}
	kept, running := running[jobs], running[:jobs] // one attempt goes on, without a result

	// The store stalls; every job's result is offered once, and waits for its write.
	st.stall()
	for _, a := range running {
		done := "done"
		res := &protocol.TaskResult{WorkerID: "w", JobID: a.JobID, AttemptID: a.AttemptID, Success: true, Result: &done}
		go func() { _, _ = bus.Ask[protocol.ResultAck](ctx, node, coordinator, protocol.PathResult, res) }()
	}
	eventuallyTrue(t, "the results applied, their writes held", func() bool {
		c.sched.mu.Lock()
		defer c.sched.mu.Unlock()
		applied := 0
		for _, a := range running {
			if j := c.sched.jobs[a.JobID]; j != nil && j.rec.State == protocol.StateCompleted {
				applied++
			}
		}
		return applied >= bus.DefaultMaxInFlight
	})

	// For longer than the heartbeat timeout, every heartbeat of the worker is answered
	// and it stays known, with the attempt it runs; another worker registers.
	time.Sleep(2 * cfg.HeartbeatTimeout) // the window watched, not a synchronisation
	if err := beats(); err != nil {
		t.Fatalf("heartbeat while %d results wait for a stalled store: %v, want every one answered within %v", jobs, err, beatWithin)
	}
	c.sched.mu.Lock()
	known := c.sched.reg.workers["w"] != nil
	j := c.sched.jobs[kept.JobID]
	attempt := j != nil && j.rec.State == protocol.StateRunning && j.rec.AttemptID == kept.AttemptID
	c.sched.mu.Unlock()
	if !known || !attempt {
		t.Fatalf("while results waited for a stalled store: worker known %v, its running attempt kept %v; want both", known, attempt)
	}
	other, err := bus.New(wnc, bus.Address{Role: bus.RoleWorker, ID: "w2"}, bus.WithLogger(nil), bus.WithAskTimeout(beatWithin))
	must(t, err)
	t.Cleanup(func() { _ = other.Close() })
	if _, err := bus.Ask[protocol.WorkerRegistered](ctx, other, coordinator, protocol.PathRegister,
		&protocol.WorkerRegister{WorkerID: "w2", Capacity: 1, Instance: "p1"}); err != nil {
		t.Fatalf("registration while %d results wait for a stalled store: %v, want it answered within %v", jobs, err, beatWithin)
	}
}

// heartbeating heartbeats worker id from node every interval until the returned
// function is called, which returns the first heartbeat that failed, if any.
func heartbeating(t *testing.T, node *bus.Node, id string, interval time.Duration) (stop func() error) {
	var (
		once   sync.Once
		failed error
	)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			_, err := bus.Ask[protocol.HeartbeatAck](context.Background(), node, bus.Address{Role: bus.RoleCoordinator},
				protocol.PathHeartbeat, &protocol.Heartbeat{WorkerID: id})
			if err != nil && failed == nil {
				failed = fmt.Errorf("at %s: %w", time.Now().Format(time.StampMilli), err)
			}
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	stop = func() error {
		once.Do(func() { close(quit); <-done })
		return failed
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}
