package bus

import "errors"

// Errors callers match with errors.Is. Returned errors wrap them with the address and
// path concerned.
var (
	// ErrNoPeer: no node serves the address and path (NATS "no responders"). An ask fails
	// with it at once rather than after its timeout.
	ErrNoPeer = errors.New("bus: no peer")
	// ErrTimeout: an ask got no answer before its context or the node's ask timeout
	// ended. The context's own error is wrapped too.
	ErrTimeout = errors.New("bus: timeout")
	// ErrDisconnected: the connection to NATS was down, or went down while an ask
	// waited, so its answer can no longer arrive.
	ErrDisconnected = errors.New("bus: disconnected")
	// ErrClosed: the node is closed.
	ErrClosed = errors.New("bus: node closed")
	// ErrRemote: the remote handler failed; the error is a *RemoteError.
	ErrRemote = errors.New("bus: remote error")
	// ErrInvalidAddress: an address with a bad role or id.
	ErrInvalidAddress = errors.New("bus: invalid address")
	// ErrInvalidPath: a path that cannot end a subject.
	ErrInvalidPath = errors.New("bus: invalid path")
	// ErrHandled: the path already has a handler on this node.
	ErrHandled = errors.New("bus: path already handled")
)

// RemoteError is the answer of a remote handler that returned an error (or panicked).
// errors.Is(err, ErrRemote) holds for it.
type RemoteError struct {
	Path    string // the path asked
	Message string // the remote handler's error text
}

// Error gives the remote handler's message unchanged, so that it can be passed on to a
// client as it is.
func (e *RemoteError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrRemote) true.
func (e *RemoteError) Is(target error) bool { return target == ErrRemote }
