package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
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
// The connection carries one request at a time: one frame out, one frame in. A
// connection that breaks fails the request in flight, which is never resent by the
// transport (a submission may already have been applied); the next request dials
// again. Close closes the connection.
func DialTCP(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	tr := &tcpTransport{addr: addr}
	c := NewWithTransport(tr, opts...)
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

// tcpTransport is the client side of the bridge's client port.
type tcpTransport struct {
	addr string

	// reqMu serialises requests: the protocol pairs replies with requests by order.
	reqMu sync.Mutex

	// mu guards conn and closed; it is held only briefly, so Close can interrupt a
	// request in flight.
	mu     sync.Mutex
	conn   *tcpConn // nil until dialled, and after a failure
	closed bool
}

// tcpConn is a connection with its frame reader, which only the request holding
// reqMu uses.
type tcpConn struct {
	net.Conn
	r    *frame.Reader
	wbuf []byte // the request frame, reused

	// expire, made once, expires the connection's deadline when a request's ctx ends,
	// and then signals expired (buffered: the request waits for it only when stopping
	// the watch failed). poisoned: expire ran, so the deadline is in the past until
	// the next request clears it.
	expire   func()
	expired  chan struct{}
	poisoned bool
}

func newTCPConn(nc net.Conn) *tcpConn {
	c := &tcpConn{Conn: nc, r: frame.NewReader(nc), expired: make(chan struct{}, 1)}
	c.expire = func() {
		_ = c.SetDeadline(time.Unix(1, 0))
		c.expired <- struct{}{}
	}
	return c
}

// maxKeptBuf bounds the request buffer a connection keeps between requests.
const maxKeptBuf = 64 << 10

// RoundTrip sends body as one frame and returns the next frame the bridge sends back.
func (t *tcpTransport) RoundTrip(ctx context.Context, typ protocol.Type, body []byte) ([]byte, error) {
	if !protocol.IsClientRequest(typ) {
		return nil, fmt.Errorf("%s is not a client request", typ)
	}
	// Checked first, so a body too large to send never costs the connection.
	if len(body) == 0 || len(body) > frame.MaxSize {
		_, err := frame.Append(nil, body) // refuses it before copying, and says why
		return nil, fmt.Errorf("%s: %w", typ, err)
	}
	t.reqMu.Lock()
	defer t.reqMu.Unlock()
	conn, err := t.current(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", typ, err)
	}
	out, _ := frame.Append(conn.wbuf[:0], body)
	if cap(out) <= maxKeptBuf {
		conn.wbuf = out
	}
	reply, err := t.exchange(ctx, conn, out)
	if err != nil {
		t.drop(conn)
		return nil, t.explain(ctx, typ, err)
	}
	if closesConnection(reply) {
		t.drop(conn) // the bridge closes after it; the next request dials afresh
	}
	if isWorkerPortGreeting(reply) {
		t.drop(conn)
		return nil, &workerPortError{addr: t.addr} // whatever the request, the port is wrong
	}
	return reply, nil
}

// ErrWorkerPort means the address given for the client port is a bridge's worker
// port: it answered a client request as it answers a worker that has not registered.
var ErrWorkerPort = errors.New("a worker port, not the client port")

// isWorkerPortGreeting reports whether reply is the worker port's ERROR to a first
// message that is no WORKER_REGISTER.
func isWorkerPortGreeting(reply []byte) bool {
	if t, err := protocol.PeekType(reply); err != nil || t != protocol.TypeError {
		return false
	}
	e, err := protocol.DecodeAs[protocol.Error](reply)
	return err == nil && e.Message == protocol.FirstMessageMustRegister().Message
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

// closesConnection reports whether reply is the ERROR PROTOCOL.md sends before closing
// a connection that sent a malformed frame.
func closesConnection(reply []byte) bool {
	if t, err := protocol.PeekType(reply); err != nil || t != protocol.TypeError {
		return false
	}
	e, err := protocol.DecodeAs[protocol.Error](reply)
	return err == nil && e.ClosesConnection()
}

// current returns the open connection, dialling one if there is none.
func (t *tcpTransport) current(ctx context.Context) (*tcpConn, error) {
	t.mu.Lock()
	conn, closed := t.conn, t.closed
	t.mu.Unlock()
	switch {
	case closed:
		return nil, ErrClosed
	case conn != nil:
		return conn, nil
	}
	nc, err := t.dial(ctx)
	if err != nil {
		return nil, err
	}
	return t.use(nc)
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

// use installs a fresh connection, unless the transport was closed meanwhile.
func (t *tcpTransport) use(nc net.Conn) (*tcpConn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		_ = nc.Close()
		return nil, ErrClosed
	}
	t.conn = newTCPConn(nc)
	return t.conn, nil
}

// exchange writes one request frame and reads one reply frame, within ctx: when ctx
// ends (its deadline passes, or it is cancelled) the connection's deadline expires,
// which interrupts the write or the read. The connection itself has no deadline
// otherwise, so a request costs no deadline to set: ctx's own timer is the only one.
func (t *tcpTransport) exchange(ctx context.Context, conn *tcpConn, out []byte) ([]byte, error) {
	if conn.poisoned {
		// The last request's ctx ended as it finished: clear the expired deadline.
		if err := conn.SetDeadline(time.Time{}); err != nil {
			return nil, err
		}
		conn.poisoned = false
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, conn.expire)
		defer func() {
			if !stop() {
				<-conn.expired // expire has run: its deadline must not outlive this request
				conn.poisoned = true
			}
		}()
	}
	if _, err := conn.Write(out); err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	reply, err := conn.r.Read()
	if err != nil {
		return nil, fmt.Errorf("await reply: %w", err)
	}
	// The reader reuses its buffer; the reply outlives the next Read.
	return slices.Clone(reply), nil
}

// drop closes a connection that failed, so the next request dials a fresh one: a
// stream that broke or timed out mid-request can no longer pair replies with requests.
func (t *tcpTransport) drop(conn *tcpConn) {
	t.mu.Lock()
	if t.conn == conn {
		t.conn = nil
	}
	t.mu.Unlock()
	_ = conn.Close()
}

// explain names why a request failed: the client closed, ctx ended, or the connection
// broke, in which case whether the request took effect is unknown.
func (t *tcpTransport) explain(ctx context.Context, typ protocol.Type, err error) error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("%s: %w", typ, ErrClosed)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: no reply from %s: %w", typ, t.addr, ctx.Err())
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The connection's deadline is ctx's, which may expire a moment before ctx does.
		return fmt.Errorf("%s: no reply from %s: %w", typ, t.addr, context.DeadlineExceeded)
	}
	return fmt.Errorf("%s: connection to %s broken, outcome unknown: %w", typ, t.addr, err)
}

// Close closes the connection, interrupting a request in flight. It is idempotent.
func (t *tcpTransport) Close() error {
	t.mu.Lock()
	conn := t.conn
	t.conn, t.closed = nil, true
	t.mu.Unlock()
	if conn == nil {
		return nil
	}
	return conn.Close()
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
