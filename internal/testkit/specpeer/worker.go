package specpeer

import (
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Worker is a healthy scripted spec worker: registered on its own connection, it
// heartbeats and completes every task it is assigned with the result "done". It stops
// when Stop is called or the test ends.
type Worker struct {
	*Peer
	id   string
	done chan struct{}
	stop sync.Once
	wg   sync.WaitGroup
}

// StartWorker dials the worker port at addr, registers id with capacity, and serves
// until the test ends, heartbeating every heartbeat.
func StartWorker(t testing.TB, addr, id string, capacity int, heartbeat time.Duration, opts ...Option) *Worker {
	t.Helper()
	w := &Worker{Peer: Dial(t, addr, opts...), id: id, done: make(chan struct{})}
	w.Register(id, capacity)
	w.Forward(w.serve)
	w.wg.Add(1)
	go w.beat(heartbeat)
	t.Cleanup(w.Stop)
	return w
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.id }

func (w *Worker) serve(m protocol.Message) {
	if a, ok := m.(*protocol.TaskAssign); ok {
		result := "done"
		_ = w.Send(&protocol.TaskResult{WorkerID: w.id, JobID: a.JobID, AttemptID: a.AttemptID, Success: true, Result: &result})
	}
}

func (w *Worker) beat(every time.Duration) {
	defer w.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-t.C:
			if w.Send(&protocol.Heartbeat{WorkerID: w.id}) != nil {
				return
			}
		}
	}
}

// Stop closes the connection and waits for the worker's goroutines; the bridge sees
// the worker go. It may be called again.
func (w *Worker) Stop() {
	w.stop.Do(func() {
		close(w.done)
		_ = w.Close()
		w.wg.Wait()
		w.Peer.wg.Wait()
	})
}
