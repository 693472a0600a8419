package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
)

// ErrClosed is returned by a request on a client whose TCP transport was closed.
var ErrClosed = errors.New("client closed")

// DialTCP returns a client speaking PROTOCOL.md's framed TCP to a bridge's client
// port (default 7071) at addr (host:port). It dials at once, within ctx or else the
// client's timeout, so a bridge that is not there is reported here.
//
// The connection carries many requests at once: concurrent calls on the client queue
// their frames on it in turn, frames queued together going out in one write, and the
// bridge's replies, which come in the order of the requests, go back to the callers in
// that order. At most 64 requests are in flight on the connection; a caller beyond
// that waits for one of them to finish, within its ctx. A caller whose ctx ends while
// it writes its frame, the only one queued, to a bridge that does not take it (it
// stopped reading) returns then, not at the client's timeout: its frame was not
// written whole, so the error says it was not sent, and the connection is dropped. A
// caller whose ctx ends later stops waiting, but its request keeps its place: its
// reply is read and discarded, and the connection stays (unless all 64 requests in
// flight were given up on like this: such a connection is dropped as one that no
// longer answers). A connection that breaks fails the requests in flight with an
// error that matches ErrOutcomeUnknown, but for those whose frames it never wrote
// whole (queued behind a write the bridge did not take), which the bridge cannot have
// acted on: theirs says "not sent". None is resent by the transport (a submission may
// already have been applied); the next request dials again, as does one that found
// the connection broken before it sent anything. Close closes the connection, failing
// the requests in flight with ErrClosed, which also matches ErrOutcomeUnknown for
// those whose frames were written whole (for the others it says "not sent").
func DialTCP(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	tr := &tcpTransport{addr: addr, dialing: make(chan struct{}, 1)}
	c := NewWithTransport(tr, append([]Option{WithTimeout(tcpTimeout)}, opts...)...)
	tr.writeStall = c.timeout
	if _, has := ctx.Deadline(); !has {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	if _, err := tr.current(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// tcpTimeout is a DialTCP client's default request bound (WithTimeout): the bridge's
// default request timeout (5 s) and a second. A bridge whose coordinator does not
// answer a submission within its request timeout answers "Outcome unknown" naming the
// job, which a client that gave up at the same moment would never hear: it would
// have only its context's error, and no job to ask about.
const tcpTimeout = 6 * time.Second

// maxSendTries bounds the connections a request tries to queue its frame on: one found
// broken before anything was sent on it is replaced by a fresh one, but not forever.
const maxSendTries = 2

// maxInFlight bounds the requests in flight on a connection (queued to be written, or
// written and waiting for their replies), and so the memory their frames and waiters
// hold.
const maxInFlight = 64

// maxKeptBuf bounds the write buffer a connection keeps between writes.
const maxKeptBuf = 64 << 10

// tcpTransport is the client side of the bridge's client port.
type tcpTransport struct {
	addr string
	// writeStall bounds a write (the client's timeout): the flusher's carries many
	// callers' frames, so no caller's ctx can cut it short; a write the bridge does not
	// take within this (at least half of it, see write) breaks the connection instead.
	// A lone caller's write of its own frame ends with its ctx as well (send).
	writeStall time.Duration

	// dialing holds a token while a caller dials: callers that find no connection
	// together (one just broke under them) wait for that one dial, within their ctx,
	// rather than each dial a connection of its own, of which the transport could keep
	// only one: the others would live on unknown to it, and to Close.
	dialing chan struct{}

	// mu guards conn and closed; it is held only briefly, so Close can interrupt the
	// requests in flight.
	mu     sync.Mutex
	conn   *tcpConn // nil until dialled, and after a failure
	closed bool

	readers sync.WaitGroup // the connections' reader and flusher goroutines; Close waits for them
	waiters sync.Pool      // of *waiter, so a request costs no channel
}

// RoundTrip sends body as one frame and returns the frame the bridge sends back for it.
func (t *tcpTransport) RoundTrip(ctx context.Context, typ protocol.Type, body []byte) ([]byte, error) {
	if !protocol.IsClientRequest(typ) {
		return nil, fmt.Errorf("%s is not a client request", typ)
	}
	// Checked first, so a body too large to send never costs the connection.
	if len(body) == 0 || len(body) > frame.MaxSize {
		_, err := frame.Append(nil, body) // refuses it before copying, and says why
		return nil, fmt.Errorf("%s: %w", typ, err)
	}
	w := t.waiter()
	var conn *tcpConn
	for tries := 1; ; tries++ {
		var err error
		if conn, err = t.current(ctx); err != nil {
			t.waiters.Put(w)
			return nil, fmt.Errorf("%s: %w", typ, err)
		}
		err = conn.send(ctx, body, w)
		if err == nil {
			break
		}
		if ctx.Err() != nil || tries == maxSendTries {
			t.waiters.Put(w)
			return nil, t.explain(ctx, typ, false, err)
		}
		// The connection broke before the frame was queued (its reader had not
		// noticed yet when this request took it): nothing was sent, so it goes on a
		// fresh one.
	}
	reply, err := conn.await(ctx, w)
	if err != nil {
		return nil, t.explain(ctx, typ, true, err)
	}
	if isWorkerPortGreeting(reply) {
		return nil, &workerPortError{addr: t.addr} // whatever the request, the port is wrong
	}
	return reply, nil
}

// waiter is one request's place in its connection's queue of replies due.
type waiter struct {
	done chan result // buffered, so the reader never waits for the caller

	// Guarded by the connection's mu.
	queued    bool // in the queue: its reply has not been read
	abandoned bool // its caller's ctx ended: its reply is to be discarded
}

type result struct {
	reply []byte
	err   error
}

// waiter returns an idle waiter. A waiter goes back to the pool from whoever holds it
// last: its caller once it has its result, or, when its caller gave up on it, the
// connection once its reply is read or the connection failed.
func (t *tcpTransport) waiter() *waiter {
	if w, ok := t.waiters.Get().(*waiter); ok {
		w.queued, w.abandoned = false, false
		return w
	}
	return &waiter{done: make(chan result, 1)}
}

// ErrWorkerPort means the address given for the client port is a bridge's worker
// port: it answered a client request as it answers a worker that has not registered.
var ErrWorkerPort = errors.New("a worker port, not the client port")

// isWorkerPortGreeting reports whether reply is the worker port's ERROR to a first
// message that is no WORKER_REGISTER.
func isWorkerPortGreeting(reply []byte) bool {
	e, ok := protocol.AsError(reply)
	return ok && e.Message == protocol.FirstMessageMustRegister().Message
}

// workerPortError names the port a client should have used. It matches ErrWorkerPort.
type workerPortError struct{ addr string }

func (e *workerPortError) Error() string {
	host, port, err := net.SplitHostPort(e.addr)
	if err == nil && port == "7070" {
		return fmt.Sprintf("%s is the worker port; clients use 7071 (%s)", port, net.JoinHostPort(host, "7071"))
	}
	return fmt.Sprintf("%s is a worker port (it answered %q); clients use the bridge's client port (7071 by default)",
		e.addr, protocol.FirstMessageMustRegister().Message)
}

func (e *workerPortError) Unwrap() error { return ErrWorkerPort }

// endsConnection reports whether reply is an ERROR after which the bridge closes the
// connection: the one PROTOCOL.md sends before closing a connection that sent a
// malformed frame, or the worker port's greeting.
func endsConnection(reply []byte) bool {
	e, ok := protocol.AsError(reply)
	return ok && (e.ClosesConnection() || e.Message == protocol.FirstMessageMustRegister().Message)
}

// current returns the open connection, dialling one if there is none, or waiting for
// the one another caller is dialling.
func (t *tcpTransport) current(ctx context.Context) (*tcpConn, error) {
	if conn, err := t.installed(); conn != nil || err != nil {
		return conn, err
	}
	select {
	case t.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("dial %s: %w", t.addr, ctx.Err())
	}
	defer func() { <-t.dialing }()
	if conn, err := t.installed(); conn != nil || err != nil { // the dial waited for
		return conn, err
	}
	nc, err := t.dial(ctx)
	if err != nil {
		return nil, err
	}
	return t.use(nc)
}

// installed returns the open connection (nil if there is none), or ErrClosed.
func (t *tcpTransport) installed() (*tcpConn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	return t.conn, nil
}

// dial connects to the bridge; a refusal or silence is ErrNoCoordinator.
func (t *tcpTransport) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", t.addr)
	switch {
	case err == nil:
		return conn, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("dial %s: %w", t.addr, ctx.Err())
	}
	return nil, &noBridgeError{addr: t.addr, err: err}
}

// use installs a fresh connection and starts its reader, unless the transport was
// closed meanwhile.
func (t *tcpTransport) use(nc net.Conn) (*tcpConn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		_ = nc.Close()
		return nil, ErrClosed
	}
	c := &tcpConn{
		t:       t,
		nc:      nc,
		r:       frame.NewReader(nc),
		slots:   make(chan struct{}, maxInFlight),
		broken:  make(chan struct{}),
		backlog: make(chan struct{}, 1),
	}
	t.conn = c
	t.readers.Add(2)
	go c.readLoop()
	go c.flushLoop()
	return c, nil
}

// drop forgets a connection that failed, so the next request dials a fresh one, and
// closes it, which ends its reader.
func (t *tcpTransport) drop(conn *tcpConn) {
	t.mu.Lock()
	if t.conn == conn {
		t.conn = nil
	}
	t.mu.Unlock()
	_ = conn.nc.Close()
}

// explain names why a request failed: the client closed, ctx ended, or the connection
// broke. sent says whether its frame was queued, and so may have been written (unless
// the connection says none was written whole, errNotSent): then the bridge may have
// acted on it, and unless ctx ended (whose error the caller gets, as documented) the
// error says the outcome is unknown (ErrOutcomeUnknown).
func (t *tcpTransport) explain(ctx context.Context, typ protocol.Type, sent bool, err error) error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	sent = sent && !errors.Is(err, errNotSent)
	switch {
	case closed && sent:
		return fmt.Errorf("%s: client closed before %s replied, %w: %w", typ, t.addr, ErrOutcomeUnknown, ErrClosed)
	case closed:
		return fmt.Errorf("%s: not sent: %w", typ, ErrClosed)
	case ctx.Err() != nil && !sent:
		return fmt.Errorf("%s: not sent to %s: %w", typ, t.addr, ctx.Err())
	case ctx.Err() != nil:
		return fmt.Errorf("%s: no reply from %s: %w", typ, t.addr, ctx.Err())
	case sent:
		// The client port carries no request id: the error names no job (OutcomeJob
		// finds none), and a submission is safe to send again only under an
		// idempotency key.
		return fmt.Errorf("%s: connection to %s broken, %w: %w", typ, t.addr, ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("%s: not sent: connection to %s broken: %w", typ, t.addr, err)
}

// Close closes the connection, interrupting the requests in flight, and waits for its
// reader to end. It is idempotent.
func (t *tcpTransport) Close() error {
	t.mu.Lock()
	conn := t.conn
	t.conn, t.closed = nil, true
	t.mu.Unlock()
	if conn != nil {
		conn.fail(ErrClosed)
	}
	t.readers.Wait()
	return nil
}

// tcpConn is one connection to the client port. Its requests pair with its replies by
// order: each request queues its frame and its waiter together, under mu, so the
// frames go out in the order of the waiters, and the reader hands each reply to the
// oldest waiter.
//
// A caller whose ctx ends leaves its waiter in the queue, marked abandoned, and the
// reader discards that reply when it comes. (The transport used to carry one request
// at a time and drop the connection when a request's ctx ended, since the late reply
// would have been taken for the next request's; with the queue the late reply has
// its own place, so the connection keeps its pairing and stays.)
type tcpConn struct {
	t  *tcpTransport
	nc net.Conn
	r  *frame.Reader // the reader goroutine's
	// armed is when the write deadline was last set; only the writer (whoever set
	// writing, under mu: a caller, or the flusher it handed over to) uses it.
	armed time.Time

	// slots holds a token per request in flight: taken before its frame is queued,
	// given back when its reply is read. It bounds the queue below.
	slots   chan struct{}
	broken  chan struct{} // closed when the connection fails
	backlog chan struct{} // hands the flusher what callers queued during a write

	mu  sync.Mutex
	err error // why the connection failed; nil while it works
	// out holds the frames queued and not yet taken by a write. The caller that finds
	// no write in progress writes it, outside mu; what callers queue meanwhile goes to
	// the flusher (flush), so frames queued together cost one write, and a lone
	// request costs no goroutine but the reader. spare is the last write's buffer,
	// reused for the next frames.
	out     []byte
	spare   []byte
	writing bool
	// lens are the sizes of the frames in out, in order (spareLens: the last write's,
	// reused). unsent counts the waiters, the newest in queue, whose frames were not
	// written whole yet: the bridge, which acts on whole frames only, cannot have acted
	// on them. writes counts the writes in progress, which fail waits out, so that what
	// they wrote is known before it tells each waiter whether its frame went.
	lens, spareLens []int
	unsent          int
	writes          sync.WaitGroup
	// queue is a ring of the waiters whose replies are due, oldest at head.
	queue     [maxInFlight]*waiter
	head, n   int
	abandoned int // the waiters in queue whose callers gave up on them
}

// send queues body's frame and w, and writes what is queued unless another caller is
// writing it. An error means the frame was not queued.
func (c *tcpConn) send(ctx context.Context, body []byte, w *waiter) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.broken:
		return c.failure()
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		<-c.slots
		return err
	}
	before := len(c.out)
	c.out, _ = frame.Append(c.out, body) // RoundTrip checked its size
	c.lens = append(c.lens, len(c.out)-before)
	c.unsent++
	c.queue[(c.head+c.n)%maxInFlight] = w
	c.n++
	w.queued = true
	switch {
	case c.writing:
		c.mu.Unlock() // the writer takes it
	case c.n > 1:
		// Others are in flight: their callers, woken by their replies, are about to
		// queue more, which the flusher gathers into one write.
		c.writing = true
		c.mu.Unlock()
		c.backlog <- struct{}{}
	default:
		// The frame is the only one queued: its caller writes it, until ctx ends.
		c.writing = true
		c.flush(ctx, false)
	}
	return nil
}

// flush writes what is queued, with c.mu held and writing set, and returns with c.mu
// released. A caller (ctx its own, its frame the only one queued) writes once: what
// other callers queued during its write goes to the connection's flusher goroutine
// (backlog), which writes until nothing is left, so no caller is held writing for
// others for longer than one write.
func (c *tcpConn) flush(ctx context.Context, backlog bool) {
	for c.err == nil && len(c.out) > 0 {
		buf, lens := c.out, c.lens
		c.out, c.spare = c.spare[:0], nil
		c.lens, c.spareLens = c.spareLens[:0], nil
		c.writes.Add(1)
		c.mu.Unlock()
		n, err := c.write(ctx, buf)
		c.mu.Lock()
		c.unsent -= written(lens, n)
		c.writes.Done()
		if cap(buf) <= maxKeptBuf {
			c.spare, c.spareLens = buf[:0], lens[:0]
		}
		if err != nil {
			c.writing = false
			c.mu.Unlock()
			// The frames after the last one written whole went out in part at
			// most: fail tells their waiters they were not sent.
			c.fail(fmt.Errorf("send: %w", err)) // the waiters' error comes to await
			return
		}
		if !backlog && len(c.out) > 0 {
			c.mu.Unlock()
			c.backlog <- struct{}{} // writing stays set: the flusher's now
			return
		}
	}
	c.writing = false
	c.mu.Unlock()
}

// written is how many of the frames of sizes lens, in order, the first n bytes hold
// whole.
func written(lens []int, n int) int {
	for i, l := range lens {
		if n < l {
			return i
		}
		n -= l
	}
	return len(lens)
}

// flushLoop writes the backlogs callers hand it, until the connection fails.
func (c *tcpConn) flushLoop() {
	defer c.t.readers.Done()
	for {
		select {
		case <-c.backlog:
			runtime.Gosched() // let the callers woken with this one queue theirs first
			c.mu.Lock()
			c.flush(context.Background(), true) // no caller's: it ends with the connection
		case <-c.broken:
			return
		}
	}
}

// write writes buf, and returns how much of it went, failing if it cannot within
// writeStall or, if ctx can end (a lone caller's write of its own frame), once ctx
// ends. The deadline is moved on only once half of it has passed, so a write costs no
// timer of its own: each write has at least half of writeStall.
func (c *tcpConn) write(ctx context.Context, buf []byte) (int, error) {
	if stall := c.t.writeStall; stall > 0 {
		if now := time.Now(); now.Sub(c.armed) > stall/2 {
			if err := c.nc.SetWriteDeadline(now.Add(stall)); err != nil {
				return 0, err
			}
			c.armed = now
		}
	}
	if ctx.Done() != nil {
		// ctx's end moves the deadline to now, which cuts the write short. Once it
		// did, the next write sets a deadline of its own.
		cut := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			_ = c.nc.SetWriteDeadline(time.Now())
			close(cut)
		})
		defer func() {
			if !stop() {
				<-cut
				c.armed = time.Time{}
			}
		}()
	}
	return c.nc.Write(buf)
}

// await returns w's reply, or ctx's error if ctx ends first, leaving w to be
// discarded when its reply comes.
func (c *tcpConn) await(ctx context.Context, w *waiter) ([]byte, error) {
	select {
	case r := <-w.done:
		c.t.waiters.Put(w)
		return r.reply, r.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if !w.queued { // its result is on its way: take it
		c.mu.Unlock()
		r := <-w.done
		c.t.waiters.Put(w)
		return r.reply, r.err
	}
	w.abandoned = true
	c.abandoned++
	unanswered := c.abandoned == maxInFlight
	c.mu.Unlock()
	if unanswered {
		c.fail(errUnanswered)
	}
	return nil, ctx.Err()
}

// errNotSent fails the requests of a failed connection whose frames were not written
// whole: the bridge cannot have acted on them.
var errNotSent = errors.New("not written whole")

// errEndedByBridge fails the requests behind a reply that ends the connection.
var errEndedByBridge = errors.New("the bridge ended the connection with an ERROR")

// errUnanswered fails a connection whose every request in flight was given up on.
var errUnanswered = fmt.Errorf("no reply to %d requests in flight", maxInFlight)

// pop takes the oldest waiter off the queue; it reports false when the queue is empty.
// An abandoned waiter goes back to the pool, and pop returns nil for it. c.mu is held.
func (c *tcpConn) pop() (*waiter, bool) {
	if c.n == 0 {
		return nil, false
	}
	w := c.queue[c.head]
	c.queue[c.head] = nil
	c.head = (c.head + 1) % maxInFlight
	c.n--
	w.queued = false
	if w.abandoned {
		c.abandoned--
		c.t.waiters.Put(w)
		return nil, true
	}
	return w, true
}

// readLoop reads the replies and hands each to its waiter, until the connection fails.
func (c *tcpConn) readLoop() {
	defer c.t.readers.Done()
	for {
		reply, err := c.r.Read()
		if err != nil {
			c.fail(fmt.Errorf("await reply: %w", err))
			return
		}
		c.mu.Lock()
		w, ok := c.pop()
		c.mu.Unlock()
		if !ok {
			c.fail(errors.New("a reply to no request"))
			return
		}
		<-c.slots
		last := endsConnection(reply)
		if last {
			// The bridge closes the connection after this reply: forget it before its
			// waiter returns, so that caller's next request dials afresh. The requests
			// behind it may or may not have been read.
			c.fail(errEndedByBridge)
		}
		if w != nil {
			// The reader reuses its buffer; the reply outlives the next Read.
			w.done <- result{reply: slices.Clone(reply)}
		}
		if last {
			return
		}
	}
}

// fail breaks the connection once: it forgets and closes it, and fails the waiters in
// its queue with err, wrapped in errNotSent for those whose frames were not written
// whole. A write in progress (Close's, or the reader's, during a stalled write) ends
// once the connection is closed, and is waited for: it says how much of its frames
// went.
func (c *tcpConn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err // no frame is queued, nor write begun, from now on
	c.mu.Unlock()
	c.t.drop(c) // before the waiters return, so their next requests dial afresh
	c.writes.Wait()
	notSent := fmt.Errorf("%w: %w", errNotSent, err)
	type failure struct {
		w   *waiter
		err error
	}
	var failed []failure
	c.mu.Lock()
	for i, sent := 0, c.n-c.unsent; ; i++ {
		w, ok := c.pop()
		if !ok {
			break
		}
		switch {
		case w == nil: // given up on
		case i < sent:
			failed = append(failed, failure{w, err})
		default:
			failed = append(failed, failure{w, notSent})
		}
	}
	c.out, c.spare, c.lens, c.spareLens, c.unsent = nil, nil, nil, nil, 0
	c.mu.Unlock()
	close(c.broken)
	for _, f := range failed {
		f.w.done <- result{err: f.err}
	}
}

// failure is why the connection failed.
func (c *tcpConn) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// noBridgeError reports that nothing answered at the bridge's address. It matches
// ErrNoCoordinator and the dial error.
type noBridgeError struct {
	addr string
	err  error
}

func (e *noBridgeError) Error() string {
	msg := fmt.Sprintf("no jobbus bridge answered on %s (is `jobbus serve` running?)", e.addr)
	if errors.Is(e.err, syscall.ECONNREFUSED) {
		return msg
	}
	return msg + ": " + e.err.Error()
}

func (e *noBridgeError) Unwrap() []error { return []error{ErrNoCoordinator, e.err} }
