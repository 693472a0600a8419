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
func (c *Coordinator) later(send func() error, to *worker) {
	c.outbox = append(c.outbox, outgoing{send: send, to: to})
}

// replyLater queues a client reply. Called with c.mu held.
func (c *Coordinator) replyLater(reply replyFunc, m protocol.Message) {
	c.later(func() error { reply(m); return nil }, nil)
}

// unlock releases c.mu and sends what was queued while it was held. A worker whose
// assignment could not be sent is lost, as if its connection had closed.
func (c *Coordinator) unlock() {
	out := c.outbox
	if len(out) == 0 {
		c.mu.Unlock()
		return
	}
	c.outbox = nil
	c.sendMu.Lock()
	c.mu.Unlock()
	var lost []failedSend
	for _, o := range out {
		if err := o.send(); err != nil && o.to != nil {
			lost = append(lost, failedSend{o.to, err})
		}
	}
	c.sendMu.Unlock()
	for _, f := range lost {
		c.mu.Lock()
		c.loseWorker(f.w, "assignment could not be sent: "+f.err.Error())
		c.schedule()
		c.unlock()
	}
}

type failedSend struct {
	w   *worker
	err error
}
