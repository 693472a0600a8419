//go:build linux

package tcpworker

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// abortWhenUnacknowledged makes the kernel abort conn once data written on it has
// gone unacknowledged by the peer for d (TCP_USER_TIMEOUT): the next read then fails,
// and the session ends. A conn that is not a socket is left alone.
func abortWhenUnacknowledged(conn net.Conn, d time.Duration) error {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	}); err != nil {
		return err
	}
	return serr
}
