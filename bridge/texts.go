package bridge

import (
	"fmt"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
)

// The bridge's own ERROR texts: failures of the bridge or of the way to the
// coordinator, which the coordinator cannot produce itself. The protocol's texts come
// from bus/protocol.

// errUnavailable: no coordinator answered a request in time.
func errUnavailable(detail string) *protocol.Error {
	return protocol.CoordinatorUnavailable(detail)
}

// errNATSDown: the bridge's own NATS connection is down, so no request can reach
// the coordinator; the client may try again once it is back.
func errNATSDown() *protocol.Error {
	return errUnavailable("the bridge has lost its NATS connection and is reconnecting; nothing was sent, try again")
}

// errTooLargeToForward: a request the bridge's NATS connection refused to send, since
// with its headers it exceeds the server's maximum payload.
func errTooLargeToForward(n int, max int64) *protocol.Error {
	return &protocol.Error{Message: fmt.Sprintf("Request too large to forward: %d bytes and their headers exceed "+
		"the NATS server's maximum payload of %d bytes; nothing was sent", n, max)}
}

// errShuttingDown: the bridge is closing.
func errShuttingDown() *protocol.Error {
	return &protocol.Error{Message: "bridge shutting down"}
}

// errReplyTooLarge: a reply that would not fit in a frame.
func errReplyTooLarge(n int) *protocol.Error {
	return &protocol.Error{Message: fmt.Sprintf("reply of %d bytes exceeds the %d-byte frame limit", n, frame.MaxSize)}
}

// errTooManyConns: a connection beyond the port's limit.
func errTooManyConns(limit int) *protocol.Error {
	return &protocol.Error{Message: fmt.Sprintf("too many connections (limit %d)", limit)}
}
