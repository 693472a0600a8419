package coordinator

import (
	"sync"
)

import "github.com/jobbus/jobbus/bus/protocol"

// Messages decided under the scheduler's mu (assignments, cancels, replies) are sent
// after it is released, so that NATS writes never lengthen the scheduler's critical
// section. They leave in the order they were decided: the goroutine releasing mu takes
// sendMu before letting go of mu, and sends while holding only sendMu. So a TASK_ASSIGN
// decided before a TASK_CANCEL of the same attempt is sent before it.

// outbox holds the messages decided under the scheduler's mu until the goroutine that
// holds it releases it (scheduler.unlock), and sends them in the order they were
// decided. Its queue is guarded by the scheduler's mu; sendMu is its own.
type outbox struct {
	queue  []outgoing
	sendMu sync.Mutex // held while sending the queue taken, so messages leave in order
}

// outgoing is one message to send once the scheduler's mu is released.
type outgoing struct {
	send func() error
	// to is the worker a failed send loses (a TASK_ASSIGN that cannot be sent), or nil.
	to *worker
}

// later queues a message to send once the scheduler's mu is released. Called with it
// held.
func (o *outbox) later(send func() error, to *worker) {
	o.queue = append(o.queue, outgoing{send: send, to: to})
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
	s.out.queue = nil
	s.out.sendMu.Lock()
	s.mu.Unlock()
	var lost []failedSend
	for _, o := range out {
		if err := o.send(); err != nil && o.to != nil {
			lost = append(lost, failedSend{o.to, err})
		}
	}
	s.out.sendMu.Unlock()
	for _, f := range lost {
		s.mu.Lock()
		s.reg.loseWorker(f.w, "assignment could not be sent: "+f.err.Error())
		s.schedule()
		s.unlock()
	}
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
