package bridge

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
)

// errStalled: a frame began but did not complete within the frame-stall timeout.
var errStalled = errors.New("frame stalled")

// readFrame returns the next payload of r, which reads c. A connection may stay idle
// between frames for as long as it likes, but a frame that has begun must complete:
// the deadline is re-armed every stall, and a frame still incomplete at two deadlines
// in a row fails. A frame trickled a byte at a time therefore gets between one and two
// stall periods in all (the deadline is absolute, so bytes arriving do not extend it;
// the first deadline after the frame began lies at most a stall ahead, and the second a
// stall after the first, however lazily dl re-arms the first).
func readFrame(c net.Conn, r *frame.Reader, dl *deadline, stall time.Duration) ([]byte, error) {
	return readFrameIdle(c, r, dl, stall, true)
}

// readFirstFrame is readFrame for a message that is due at once (a worker's
// registration): the frame must begin within stall too, so a silent connection does
// not hold a slot of the port forever.
func readFirstFrame(c net.Conn, r *frame.Reader, dl *deadline, stall time.Duration) ([]byte, error) {
	return readFrameIdle(c, r, dl, stall, false)
}

func readFrameIdle(c net.Conn, r *frame.Reader, dl *deadline, stall time.Duration, idleOK bool) ([]byte, error) {
	midFrame := false
	for {
		if err := dl.arm(c.SetReadDeadline, stall); err != nil {
			return nil, err
		}
		p, err := r.Read()
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, err
		}
		dl.expired()
		switch {
		case !r.Started() && idleOK:
			midFrame = false
		case !r.Started():
			return nil, fmt.Errorf("%w: no frame within %v", errStalled, stall)
		case midFrame:
			return nil, fmt.Errorf("%w: no complete frame within %v", errStalled, 2*stall)
		default:
			midFrame = true
		}
	}
}

// A deadline is one deadline of a connection (its reads', or its writes'), set lazily:
// arm sets it a full timeout ahead, and again only once a tenth of that has gone by, so
// that a busy connection moves it a few times a second rather than at every frame
// (each move updates a timer of the runtime's poller). Whatever arm was called last
// with, the deadline lies between nine tenths of it and all of it ahead. One goroutine
// (the connection's reader, or its writer) owns it.
type deadline struct {
	at time.Time // the deadline last set; zero: none, or expired
}

// arm makes sure the deadline lies within (d*9/10, d] from now, through set (the
// connection's SetReadDeadline or SetWriteDeadline) when it does not.
func (dl *deadline) arm(set func(time.Time) error, d time.Duration) error {
	now := time.Now()
	if left := dl.at.Sub(now); !dl.at.IsZero() && left > d-d/10 && left <= d {
		return nil
	}
	at := now.Add(d)
	if err := set(at); err != nil {
		dl.at = time.Time{}
		return err
	}
	dl.at = at
	return nil
}

// expired records that the deadline passed (or was moved by someone else): the next
// arm sets it again.
func (dl *deadline) expired() { dl.at = time.Time{} }

// writeFrame writes one frame within timeout.
func writeFrame(c net.Conn, payload []byte, timeout time.Duration) error {
	if err := c.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	return frame.Write(c, payload)
}

// writeFrameBuf is writeFrame building the frame in buf, which it returns for the
// next frame (unless it grew beyond batchBytes), so a connection's replies cost no
// allocation; dl is the connection's write deadline, armed lazily.
func writeFrameBuf(c net.Conn, dl *deadline, buf, payload []byte, timeout time.Duration) ([]byte, error) {
	out, err := frame.Append(buf[:0], payload)
	if err != nil {
		return buf, err
	}
	if cap(out) <= batchBytes {
		buf = out
	}
	if err := dl.arm(c.SetWriteDeadline, timeout); err != nil {
		return buf, err
	}
	if _, err := c.Write(out); err != nil {
		dl.expired()
		return buf, fmt.Errorf("frame: write: %w", err)
	}
	return buf, nil
}

// lingerMax bounds how long a closing connection is drained.
const lingerMax = 500 * time.Millisecond

// lingerClose closes c after a last frame was written. It first shuts down the write
// side and drains what the peer still sends for a moment: closing a socket with unread
// input makes TCP send a reset, which can destroy the ERROR just written before the
// peer reads it.
func lingerClose(c net.Conn, d time.Duration) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		if c.SetReadDeadline(time.Now().Add(min(d, lingerMax))) == nil {
			_, _ = io.CopyN(io.Discard, c, frame.MaxSize)
		}
	}
	_ = c.Close()
}

// encodeError encodes an ERROR message; it cannot fail for a plain message.
func encodeError(e *protocol.Error) []byte {
	data, err := protocol.Encode(e)
	if err != nil {
		return []byte(`{"type":"ERROR","message":"internal error"}`)
	}
	return data
}

// outbox is the bounded write queue of a worker connection and its writer goroutine,
// so that the bus handlers that produce frames never block on a frame's write: at most
// on a full queue (put), until the peer's writes time out.
type outbox struct {
	conn    net.Conn
	timeout time.Duration
	stall   time.Duration
	q       chan []byte
	fin     chan []byte   // the last frame, written before the connection closes
	quit    chan struct{} // closed by kill: stop now
	done    chan struct{} // closed when the writer has exited and closed conn
	buf     []byte        // the writer's batch buffer
	wdl     deadline      // the writer's write deadline

	mu        sync.Mutex
	finishing bool
	killed    bool
	reason    string // why the connection was dropped, for the log
}

func newOutbox(c net.Conn, size int, timeout, stall time.Duration) *outbox {
	o := &outbox{
		conn: c, timeout: timeout, stall: stall,
		q:    make(chan []byte, size),
		fin:  make(chan []byte, 1),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
	go o.run()
	return o
}

func (o *outbox) run() {
	defer close(o.done)
	for {
		select {
		case <-o.quit:
			_ = o.conn.Close()
			return
		case data := <-o.fin:
			_ = writeFrame(o.conn, data, o.timeout)
			lingerClose(o.conn, o.stall)
			return
		case data := <-o.q:
			if err := o.writeBatch(data); err != nil {
				o.kill("write failed: " + err.Error())
				_ = o.conn.Close()
				return
			}
		}
	}
}

// batchBytes bounds how much the writer gathers into one write.
const batchBytes = 64 << 10

// writeBatch writes first and whatever else is queued already, up to batchBytes, in one
// write: under load a worker gets its assignments in one system call rather than many.
func (o *outbox) writeBatch(first []byte) error {
	buf, err := frame.Append(o.buf[:0], first)
	if err != nil {
		return err
	}
more:
	for len(buf) < batchBytes {
		select {
		case data := <-o.q:
			if buf, err = frame.Append(buf, data); err != nil {
				return err
			}
		default:
			break more
		}
	}
	if cap(buf) <= batchBytes*2 {
		o.buf = buf // keep a modest buffer for the next batch
	}
	if err := o.wdl.arm(o.conn.SetWriteDeadline, o.timeout); err != nil {
		return err
	}
	_, err = o.conn.Write(buf)
	return err
}

// send queues a frame without waiting. A full queue means the peer does not read: the
// connection is dropped rather than buffered without bound. It reports whether the
// frame was queued.
func (o *outbox) send(data []byte) bool {
	select {
	case <-o.quit:
		return false
	default:
	}
	select {
	case o.q <- data:
		return true
	default:
		o.kill(fmt.Sprintf("write queue full (%d frames): peer not reading", cap(o.q)))
		return false
	}
}

// put queues a frame, waiting while the queue is full: for frames that come in bursts
// larger than the queue from a peer that reads them all, as a worker of a capacity
// above WriteQueue (the spec allows up to 1024) is handed its assignments. The wait is
// bounded all the same: the queue is full only while the writer writes, and a write
// the peer takes nothing of within the write timeout drops the connection (run), which
// ends the wait. It reports whether the frame was queued.
func (o *outbox) put(data []byte) bool {
	select {
	case o.q <- data:
		return true
	case <-o.quit:
		return false
	case <-o.done: // finished: the writer wrote its last frame and takes no more
		return false
	}
}

// finish writes data as the last frame (best effort) and then closes the connection.
// The caller must have stopped reading the connection: the writer drains it.
func (o *outbox) finish(data []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.finishing || o.killed {
		return
	}
	o.finishing = true
	o.fin <- data
}

// kill closes the connection now, dropping what is queued. After finish it does
// nothing, so that the last frame still goes out.
func (o *outbox) kill(reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.finishing || o.killed {
		return
	}
	o.killed = true
	o.reason = reason
	close(o.quit)
	// Unblock a write in progress; run closes it again on its way out.
	_ = o.conn.Close()
}

// dropReason is why kill dropped the connection, "" if it did not.
func (o *outbox) dropReason() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.reason
}

// wait waits for the writer to exit; the connection is closed by then.
func (o *outbox) wait() { <-o.done }
