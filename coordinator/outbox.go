package coordinator

import (
	"context"
	"sync"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// Messages decided under the scheduler's mu (assignments, cancels, replies) are sent
// after it is released, so that NATS writes never lengthen the scheduler's critical
// section. They leave in the order they were decided: the goroutine releasing mu takes
// sendMu before letting go of mu, and sends while holding only sendMu. So a TASK_ASSIGN
// decided before a TASK_CANCEL of the same attempt is sent before it.
//
// The assignments to a worker that takes batches (WorkerRegister.Assigns) go as one
// TaskAssigns per flush, in the order they were decided, at the place of the first:
// no assignment waits for another (the flush sends what is already decided), and
// moving one ahead of other messages changes nothing that counts, since a message
// decided before an assignment never concerns its attempt, whose id is new. Each is
// numbered for reconciliation when decided (w.seq), so a batch counts as its
// assignments sent alone, in order; a mark is answered only after the flush that
// carries them (flushed).

// outbox holds the messages decided under the scheduler's mu until the goroutine that
// holds it releases it (scheduler.unlock), and sends them in the order they were
// decided. Its queue is guarded by the scheduler's mu; sendMu is its own.
type outbox struct {
	queue  []outgoing
	sendMu sync.Mutex // held while sending the queue taken, so messages leave in order
	// spare is the backing of a queue sent, cleared, for the next queue (under
	// sendMu): a new one per release of the scheduler's mu cost an allocation a job.
	spare []outgoing
}

// maxSpare bounds the queue backing kept for the next (a burst's may be large).
const maxSpare = 1024

// outgoing is one message to send once the scheduler's mu is released.
type outgoing struct {
	send func() error
	// to is the worker a failed send loses (a TASK_ASSIGN that cannot be sent), or nil.
	to *worker
	// assign, when not nil, is a TASK_ASSIGN to worker to (send is nil): it goes alone,
	// or in a batch with to's other assignments of the same flush.
	assign *protocol.TaskAssign
}

// later queues a message to send once the scheduler's mu is released. Called with it
// held.
func (o *outbox) later(send func() error, to *worker) {
	o.queue = append(o.queue, outgoing{send: send, to: to})
}

// assign queues the assignment m to worker w. Called with the scheduler's mu held.
func (o *outbox) assign(w *worker, m *protocol.TaskAssign) {
	o.queue = append(o.queue, outgoing{to: w, assign: m})
}

// reply queues a client reply. Called with the scheduler's mu held.
func (o *outbox) reply(reply replyFunc, m protocol.Message) {
	o.later(func() error { reply(m); return nil }, nil)
}

// unlock releases the scheduler's mu and sends what was queued while it was held. A worker whose
// assignment could not be sent is lost, as if its connection had closed.
func (s *scheduler) unlock() {
	out := s.out.queue
	if len(out) == 0 {
		s.mu.Unlock()
		return
	}
	s.out.sendMu.Lock()
	s.out.queue, s.out.spare = s.out.spare, nil // both locks held
	s.mu.Unlock()
	var lost []failedSend
	for i := range out {
		o := &out[i]
		var err error
		switch {
		case o.assign != nil && o.to.batch > 0:
			err = s.tellAssigns(out[i:], o.to)
		case o.assign != nil:
			err = s.link.Tell(context.Background(), bus.Address{Role: bus.RoleWorker, ID: o.to.id}, protocol.PathAssign, o.assign)
		case o.send != nil:
			err = o.send()
		default: // an assignment gone in an earlier batch
			continue
		}
		if err != nil && o.to != nil {
			lost = append(lost, failedSend{o.to, err})
		}
	}
	if cap(out) <= maxSpare {
		clear(out) // its messages and workers
		s.out.spare = out[:0]
	}
	s.out.sendMu.Unlock()
	for _, f := range lost {
		s.mu.Lock()
		s.reg.loseWorker(f.w, "assignment could not be sent: "+f.err.Error())
		s.schedule()
		s.unlock()
	}
}

// tellAssigns sends w's assignments among out, from out[0] (one of them), in the order
// they were decided, as one TaskAssigns of at most w.batch assignments and, beyond the
// first, maxBatchBytes of them; those it sends are taken out of out (their assign set
// to nil). The rest go in the next, in order.
func (s *scheduler) tellAssigns(out []outgoing, w *worker) error {
	batch := protocol.TaskAssigns{Assigns: make([]protocol.TaskAssign, 0, min(len(out), w.batch))}
	size := 0
	for i := range out {
		o := &out[i]
		if o.assign == nil || o.to != w {
			continue
		}
		n := assignSize(o.assign)
		if len(batch.Assigns) > 0 && size+n > maxBatchBytes {
			break
		}
		size += n
		batch.Assigns = append(batch.Assigns, *o.assign)
		o.assign = nil
		if len(batch.Assigns) == w.batch {
			break
		}
	}
	return s.link.Tell(context.Background(), bus.Address{Role: bus.RoleWorker, ID: w.id}, protocol.PathAssigns, &batch)
}

// maxBatchBytes bounds a TaskAssigns of more than one assignment, well under NATS's
// message size (1 MiB by default), which a single assignment's payload (up to
// protocol.MaxPayloadBytes) may nearly fill alone.
const maxBatchBytes = 256 << 10

// assignSize is about what m takes in a TaskAssigns.
func assignSize(m *protocol.TaskAssign) int {
	return 128 + len(m.JobID) + len(m.AttemptID) + len(m.TaskType) + len(m.Payload) + len(m.TraceParent) + len(m.TraceState)
}

type failedSend struct {
	w   *worker
	err error
}

// flushed returns once every message decided before it was called has been handed to
// NATS. The goroutine releasing the scheduler's mu sends what was decided under it while
// holding sendMu, so taking sendMu waits for those sends. A mark answered after
// flushed leaves the coordinator's connection after the assignments it counts, and
// NATS delivers them to the worker in that order.
func (o *outbox) flushed() {
	o.sendMu.Lock()
	//lint:ignore SA2001 the lock is the wait: it is taken once the sends decided earlier are done
	o.sendMu.Unlock()
}
