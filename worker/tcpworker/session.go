package tcpworker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/worker/internal/attempts"
)

// errConnLost is the cause of a session's end, and of its attempts', when nothing
// else ended it first.
var errConnLost = errors.New("connection to the coordinator lost")

// session is one connection: registration, heartbeats and the attempts assigned on
// it. The goroutine calling run owns the frame reader; every writer goes through send.
type session struct {
	w    *Worker
	conn net.Conn
	r    *frame.Reader
	log  *slog.Logger

	// ctx ends with the connection; its cause says why. Attempt contexts derive from it.
	ctx  context.Context
	stop context.CancelCauseFunc

	// wmu serialises frames on conn: they are gathered in bw and written by the flush
	// loop, woken by dirty, so that results finishing together leave in one write.
	wmu     sync.Mutex
	bw      *bufio.Writer
	scratch []byte // a frame being built, under wmu
	dirty   chan struct{}

	wg sync.WaitGroup // the heartbeat and flush loops
}

// writeBufSize is the write buffer: a few hundred results of a trivial task.
const writeBufSize = 64 << 10

func newSession(w *Worker, conn net.Conn) *session {
	return &session{w: w, conn: conn, r: frame.NewReader(conn), log: w.log,
		bw: bufio.NewWriterSize(conn, writeBufSize), dirty: make(chan struct{}, 1)}
}

// run registers and serves the connection until it breaks, the coordinator breaks the
// protocol or parent ends. It returns once the attempts assigned on it have stopped.
func (s *session) run(parent context.Context) (registered bool, err error) {
	s.ctx, s.stop = context.WithCancelCause(parent)
	// Closing the connection is what unblocks the reader when the session must end.
	unwatch := context.AfterFunc(s.ctx, func() { _ = s.conn.Close() })
	defer func() {
		s.stop(errConnLost)
		unwatch()
		_ = s.conn.Close()
		s.wg.Wait()
		// Every attempt running is this session's, and the reader that starts them is
		// this goroutine: no Start races the Wait.
		s.w.attempts.Wait()
	}()
	if err := s.register(); err != nil {
		return false, err
	}
	s.log.Info("worker registered", "capacity", s.w.cfg.Capacity)
	s.wg.Add(2)
	go s.heartbeat()
	go s.flushLoop()
	return true, s.serve()
}

// register sends WORKER_REGISTER, the first frame a worker must send, and waits for
// the acknowledgement within the dial timeout.
func (s *session) register() error {
	msg := &protocol.WorkerRegister{WorkerID: s.w.cfg.ID, Capacity: s.w.cfg.Capacity,
		Queues: s.w.cfg.Queues, StrictQueues: s.w.cfg.StrictQueues} // none: a spec registration
	if err := s.send(msg); err != nil {
		return err
	}
	if err := s.flush(); err != nil {
		return err
	}
	_ = s.conn.SetReadDeadline(time.Now().Add(s.w.cfg.dialTimeout))
	p, err := s.r.Read()
	if err != nil {
		return fmt.Errorf("await WORKER_REGISTERED: %w", s.readErr(err))
	}
	_ = s.conn.SetReadDeadline(time.Time{})
	m, err := protocol.Decode(p)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	switch m := m.(type) {
	case *protocol.WorkerRegistered:
		if m.WorkerID != s.w.cfg.ID {
			s.log.Warn("registration acknowledged under another id", "acknowledged", m.WorkerID)
		}
		return nil
	case *protocol.Error:
		return fmt.Errorf("%w by %s: %s", ErrRegistrationRefused, s.w.addr, m.Message)
	}
	return fmt.Errorf("%w: expected WORKER_REGISTERED, got %s", ErrProtocol, m.MessageType())
}

// serve reads the coordinator's frames until the connection ends.
func (s *session) serve() error {
	for {
		p, err := s.r.Read()
		if err != nil {
			return s.readErr(err)
		}
		if err := s.handle(p); err != nil {
			return err
		}
	}
}

// readErr explains why a read failed: the session's own end comes first, since
// closing the connection is how it stops the reader.
func (s *session) readErr(err error) error {
	switch {
	case s.ctx.Err() != nil:
		return context.Cause(s.ctx)
	case errors.Is(err, io.EOF):
		return errors.New("connection closed by the coordinator")
	}
	return fmt.Errorf("read: %w", err)
}

// handle acts on one frame. A frame the worker port does not allow ends the session.
// Decode reads an assignment, the frame every job brings, without encoding/json, and
// copies its payload out of p, which the next read overwrites.
func (s *session) handle(p []byte) error {
	m, err := protocol.Decode(p)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	switch m := m.(type) {
	case *protocol.TaskAssign:
		return s.assign(m)
	case *protocol.TaskCancel:
		s.w.attempts.Cancel(m.JobID, m.AttemptID)
		return nil
	case *protocol.WorkerRegistered:
		s.log.Debug("repeated WORKER_REGISTERED ignored")
		return nil
	case *protocol.Error:
		return fmt.Errorf("coordinator sent ERROR: %s", m.Message)
	}
	return fmt.Errorf("%w: unexpected %s on the worker port", ErrProtocol, m.MessageType())
}

// assign starts an attempt, under the session's context. The coordinator counts the
// worker's free slots itself, so an assignment is never refused for capacity, only
// noted; a duplicate is ignored.
func (s *session) assign(m *protocol.TaskAssign) error {
	if m.JobID == "" || m.AttemptID == "" {
		return fmt.Errorf("%w: TASK_ASSIGN without jobId or attemptId", ErrProtocol)
	}
	s.w.attempts.Start(s.ctx, m, &assigned{s: s, m: m})
	return nil
}

// assigned is an assignment's attempts.Finisher: it reports the outcome on its
// session and holds the Set's record of the attempt (attempts.SlotHolder), so that an
// assignment costs one allocation here rather than a closure and a record.
type assigned struct {
	s    *session
	m    *protocol.TaskAssign
	slot attempts.Slot
}

func (a *assigned) Finish(o attempts.Outcome)   { a.s.finished(a.m, o) }
func (a *assigned) AttemptSlot() *attempts.Slot { return &a.slot }

// finished reports an attempt's outcome, unless the connection it came on has ended:
// the coordinator has then revoked the lease and would reject the result.
func (s *session) finished(m *protocol.TaskAssign, o attempts.Outcome) {
	// The job's attributes are added per line: log.With would allocate for every
	// result to log debug lines.
	if s.ctx.Err() != nil {
		s.log.Debug("attempt interrupted: result dropped", "job", m.JobID, "attempt", m.AttemptID, "cause", context.Cause(s.ctx))
		return
	}
	res, data, err := s.result(m, o)
	if err == nil {
		// Guarded: the arguments would be boxed on every attempt even with debug off.
		if s.log.Enabled(s.ctx, slog.LevelDebug) {
			s.log.Debug("attempt finished", "job", m.JobID, "attempt", m.AttemptID, "success", res.Success, "err", o.Text())
		}
		err = s.queue(data)
	}
	if err != nil {
		s.log.Debug("result not sent", "job", m.JobID, "attempt", m.AttemptID, "err", err)
	}
}

// result is the TASK_RESULT of an attempt, echoing its lease, and its encoding. A
// result too large for one frame becomes a failure, so the coordinator still learns
// the attempt ended.
func (s *session) result(m *protocol.TaskAssign, o attempts.Outcome) (*protocol.TaskResult, []byte, error) {
	res := attempts.Result(s.w.cfg.ID, m, o)
	if data, err := protocol.Encode(res); err == nil && len(data) <= frame.MaxSize {
		return res, data, nil
	}
	text := fmt.Sprintf("result too large: %d bytes (a frame holds at most %d)", len(o.Result), frame.MaxSize)
	res = &protocol.TaskResult{WorkerID: s.w.cfg.ID, JobID: m.JobID, AttemptID: m.AttemptID, Error: &text}
	data, err := protocol.Encode(res)
	if err != nil {
		return nil, nil, fmt.Errorf("encode %s: %w", res.MessageType(), err)
	}
	return res, data, nil
}

// heartbeat tells the coordinator the worker is alive, every interval, until the
// session ends.
func (s *session) heartbeat() {
	defer s.wg.Done()
	t := time.NewTicker(s.w.cfg.Heartbeat)
	defer t.Stop()
	hb := &protocol.Heartbeat{WorkerID: s.w.cfg.ID}
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			// Written at once, not by the flush loop: a beat must not wait for another
			// goroutine to be scheduled on a busy machine.
			if err := s.send(hb); err != nil || s.flush() != nil {
				return
			}
		}
	}
}

// send encodes m and queues it (see queue).
func (s *session) send(m protocol.Message) error {
	data, err := protocol.Encode(m)
	if err != nil {
		return fmt.Errorf("encode %s: %w", m.MessageType(), err)
	}
	return s.queue(data)
}

// queue adds the frame carrying payload to the write buffer, whole, under the write
// lock, and wakes the flush loop. Frames queued while a write is in progress leave
// together in the next one, which saves a system call per result under load and costs
// an idle worker only the wake-up. A failed write ends the session: the stream can no
// longer be trusted.
func (s *session) queue(payload []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	buf, err := frame.Append(s.scratch[:0], payload)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if cap(buf) <= writeBufSize {
		s.scratch = buf
	}
	if s.bw.Available() < len(buf) {
		// bufio writes what does not fit itself, here: give that write its deadline.
		_ = s.conn.SetWriteDeadline(time.Now().Add(s.w.cfg.dialTimeout))
	}
	if _, err := s.bw.Write(buf); err != nil {
		err = fmt.Errorf("send: %w", err)
		s.stop(err)
		return err
	}
	select {
	case s.dirty <- struct{}{}:
	default: // a flush is due already
	}
	return nil
}

// flush writes what the buffer holds, within the write timeout.
func (s *session) flush() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.bw.Buffered() == 0 {
		return nil
	}
	_ = s.conn.SetWriteDeadline(time.Now().Add(s.w.cfg.dialTimeout))
	if err := s.bw.Flush(); err != nil {
		err = fmt.Errorf("send: %w", err)
		s.stop(err)
		return err
	}
	return nil
}

// flushLoop writes the queued frames whenever there are some, until the session ends.
func (s *session) flushLoop() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.dirty:
			// Let the goroutines already runnable (handlers finishing together, the
			// reader queueing acknowledgements) go first: what they queue leaves in
			// this write rather than in a write each. Nothing waits for more work: on
			// an idle worker Gosched returns at once.
			runtime.Gosched()
			if s.flush() != nil {
				return
			}
		}
	}
}
