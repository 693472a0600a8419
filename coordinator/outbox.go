package coordinator

import "github.com/jobbus/jobbus/bus/protocol"

// Messages decided under c.mu (assignments, cancels, replies) are sent after it is
// released, so that NATS writes never lengthen the scheduler's critical section. They
// leave in the order they were decided: the goroutine releasing c.mu takes sendMu
// before letting go of c.mu, and sends while holding only sendMu. So a TASK_ASSIGN
// decided before a TASK_CANCEL of the same attempt is sent before it.

// outgoing is one message to send once c.mu is released.
type outgoing struct {
	send func() error
	// to is the worker a failed send loses (a TASK_ASSIGN that cannot be sent), or nil.
	to *worker
}

// later queues a message to send once c.mu is released. Called with c.mu held.
func (s *scheduler) later(send func() error, to *worker) {
	s.outbox = append(s.outbox, outgoing{send: send, to: to})
}

// replyLater queues a client reply. Called with c.mu held.
func (s *scheduler) replyLater(reply replyFunc, m protocol.Message) {
	s.later(func() error { reply(m); return nil }, nil)
}

// unlock releases c.mu and sends what was queued while it was held. A worker whose
// assignment could not be sent is lost, as if its connection had closed.
func (s *scheduler) unlock() {
	out := s.outbox
	if len(out) == 0 {
		s.mu.Unlock()
		return
	}
	s.outbox = nil
	s.sendMu.Lock()
	s.mu.Unlock()
	var lost []failedSend
	for _, o := range out {
		if err := o.send(); err != nil && o.to != nil {
			lost = append(lost, failedSend{o.to, err})
		}
	}
	s.sendMu.Unlock()
	for _, f := range lost {
		s.mu.Lock()
		s.loseWorker(f.w, "assignment could not be sent: "+f.err.Error())
		s.schedule()
		s.unlock()
	}
}

type failedSend struct {
	w   *worker
	err error
}
