//go:build !linux

package tcpworker

import (
	"net"
	"time"
)

// abortWhenUnacknowledged does nothing where TCP_USER_TIMEOUT is not available: a
// connection whose peer vanished without closing it then ends when the kernel gives
// up retransmitting.
func abortWhenUnacknowledged(net.Conn, time.Duration) error { return nil }
