package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// notReading is a client port that accepts connections and never reads from them (a
// bridge frozen, or too busy to read), with a small receive buffer. It returns its
// address.
func notReading(t *testing.T) string {
	t.Helper()
	ln := listenSmallReceives(t)
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, nc := range conns {
			_ = nc.Close()
		}
	})
	return ln.Addr().String()
}

// TestTCPStalledWriteEndsWithItsContext: over DialTCP, a request whose frame the bridge
// does not take (it stopped reading) returns when its context ends, with the context's
// error; it waited for the connection's write bound, the client's 6 s timeout, whatever
// its context said. Its frame was not all written, so the bridge cannot have acted on
// it: the error says it was not sent, not that the outcome is unknown.
//
// On loopback the kernel buffers a fresh connection's 1 MiB frame whole (about 3 MB
// here), so the client's send buffer is set to what a network path starts with, where
// a frame that large does stall.
func TestTCPStalledWriteEndsWithItsContext(t *testing.T) {
	t.Parallel()
	c, err := DialTCP(context.Background(), notReading(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	conn, _ := c.tr.(*tcpTransport).installed()
	if err := conn.nc.(*net.TCPConn).SetWriteBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}

	big := strings.Repeat("x", protocol.MaxMessage-1024)
	const within = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	start := time.Now()
	_, err = c.Submit(ctx, "SHA256", map[string]string{"text": big})
	if took := time.Since(start); took > within+time.Second {
		t.Fatalf("Submit whose write stalled returned after %v (%v); want it to return once its %v context ended", took, err, within)
	}
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "not sent") {
		t.Fatalf("Submit whose write stalled = %v; want the context's error, saying it was not sent (its frame was not all written)", err)
	}
}

// listenSmallReceives listens on a loopback port whose connections have a small
// receive buffer, so that a peer not reading stalls a writer soon.
func listenSmallReceives(t *testing.T) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return errors.Join(err, serr)
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
