//go:build linux

package tcpworker_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/jobbus/jobbus/worker/tcpworker"
)

// TestConnectionBoundsUnacknowledgedTime: the worker's connection tells the kernel to
// abort it once what the worker wrote has gone unacknowledged for two heartbeat
// intervals (at least a second), so that a coordinator that vanished without closing
// the connection interrupts the worker's attempts about when it loses the worker.
func TestConnectionBoundsUnacknowledgedTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		heartbeat time.Duration
		want      time.Duration
	}{
		{2 * time.Second, 4 * time.Second},
		{50 * time.Millisecond, time.Second},
	} {
		p := newPeer(t)
		conns := make(chan net.Conn, 1)
		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				conns <- c
			}
			return c, err
		}
		startWorker(t, p.addr(), tcpworker.WithHeartbeat(tc.heartbeat), tcpworker.WithDialer(dial))
		p.accept().register()
		raw, err := (<-conns).(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var gerr error
		if err := raw.Control(func(fd uintptr) {
			got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		}); err != nil || gerr != nil {
			t.Fatal(err, gerr)
		}
		if time.Duration(got)*time.Millisecond != tc.want {
			t.Errorf("heartbeat %v: TCP_USER_TIMEOUT %d ms, want %v", tc.heartbeat, got, tc.want)
		}
	}
}
