package bridge

import (
	"log/slog"
	"net"
	"sync/atomic"

	"github.com/jobbus/jobbus/bus/protocol/frame"
)

// A client may send requests ahead of their replies (PROTOCOL.md: "a connection may
// carry many requests"). Submissions sent so are forwarded at once, up to aheadMax per
// connection, while their replies are written in order, those ready together in one
// write: a client that shares one connection among many callers then costs a write
// and a read per several requests rather than per request. Anything else, and a
// submission larger than aheadFrame, waits for the replies ahead of it and is served
// in line, so what a connection holds at once stays small (aheadMax small frames and
// their small replies) and a listing's large reply is never held behind another.
const (
	aheadMax   = 32
	aheadFrame = 16 << 10
)

// pipe is what a client connection has in flight ahead of the request being read:
// the replies to write, in order, and the writer goroutine that writes them. The
// connection's reader and the writer never write at the same time: the reader writes
// only while nothing is in flight, and the writer only what is.
type pipe struct {
	b   *Bridge
	c   net.Conn
	log *slog.Logger

	// wbuf and wdl are the connection's reply buffer and write deadline, used by the
	// reader while nothing is in flight and by the writer otherwise.
	wbuf []byte
	wdl  deadline

	queue    chan *ahead   // nil until the first request sent ahead
	inFlight atomic.Int32  // requests queued and not yet written
	idle     chan struct{} // signalled when inFlight falls to 0
	written  chan struct{} // closed when the writer has ended
}

// ahead is one request sent ahead: its reply, once done is closed.
type ahead struct {
	p       *pipe
	subject string
	payload []byte
	reply   []byte
	done    chan struct{}
}

// Run forwards the request (on the bridge's pool).
func (a *ahead) Run() {
	reply, _, e := a.p.b.request(a.subject, a.payload, a.p.log)
	if e != nil {
		reply = encodeError(e)
	}
	a.reply, a.payload = reply, nil
	close(a.done)
}

// busy reports whether replies are still to be written.
func (p *pipe) busy() bool { return p.inFlight.Load() != 0 }

// send forwards a well-formed submission and queues its reply.
func (p *pipe) send(subject string, payload []byte) {
	a := &ahead{p: p, subject: subject, payload: append([]byte(nil), payload...), done: make(chan struct{})}
	p.enqueue(a)
	p.b.deliveries.Run(a)
}

// answer queues a reply that needs no request, behind those in flight.
func (p *pipe) answer(data []byte) {
	a := &ahead{p: p, reply: data, done: make(chan struct{})}
	close(a.done)
	p.enqueue(a)
}

func (p *pipe) enqueue(a *ahead) {
	if p.queue == nil {
		p.queue = make(chan *ahead, aheadMax)
		p.idle = make(chan struct{}, 1)
		p.written = make(chan struct{})
		go p.write()
	}
	p.inFlight.Add(1)
	p.queue <- a
}

// drain waits until every queued reply was written (or dropped with the connection).
func (p *pipe) drain() {
	for p.busy() {
		<-p.idle
	}
}

// close ends the writer once it has written what is queued; the connection is the
// caller's to close afterwards.
func (p *pipe) close() {
	if p.queue != nil {
		close(p.queue)
		<-p.written
	}
}

// write writes the queued replies in order, each with those behind it already done,
// until the queue closes. After a failed write it closes the connection, which ends
// the reader, and waits out the requests still queued without writing their replies.
func (p *pipe) write() {
	defer close(p.written)
	var next *ahead
	broken := false
	for {
		a := next
		next = nil
		if a == nil {
			var ok bool
			if a, ok = <-p.queue; !ok {
				return
			}
		}
		<-a.done
		n := int32(1)
		buf, err := frame.Append(p.wbuf[:0], a.reply)
	more:
		for err == nil && len(buf) < batchBytes {
			select {
			case b, ok := <-p.queue:
				if !ok {
					break more
				}
				select {
				case <-b.done:
					buf, err = frame.Append(buf, b.reply)
					n++
				default:
					next = b
					break more
				}
			default:
				break more
			}
		}
		if cap(buf) <= batchBytes {
			p.wbuf = buf
		}
		if !broken && err == nil {
			err = p.writeOut(buf)
		}
		if err != nil && !broken {
			broken = true
			p.log.Info("client dropped: write failed", "err", err)
			_ = p.c.Close()
		}
		if p.inFlight.Add(-n) == 0 {
			select {
			case p.idle <- struct{}{}:
			default:
			}
		}
	}
}

func (p *pipe) writeOut(buf []byte) error {
	if err := p.wdl.arm(p.c.SetWriteDeadline, p.b.cfg.WriteTimeout); err != nil {
		return err
	}
	if _, err := p.c.Write(buf); err != nil {
		p.wdl.expired()
		return err
	}
	return nil
}
