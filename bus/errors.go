package bus

import (
	"errors"
	"fmt"
	"strconv"
)

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

// Code classifies an ERROR answer, as micro's Nats-Service-Error-Code header does (and
// in that header): a handler answers with one by returning WithCode(code, err), and an
// asker branches on it with errors.Is(err, code).
type Code int

// Codes of ERROR answers, by HTTP's meanings.
const (
	// CodeBadRequest: the request is wrong; asking again will not help.
	CodeBadRequest Code = 400
	// CodeForbidden: the sender may not do what it asks (a worker speaking for another
	// worker, say); asking again will not help.
	CodeForbidden Code = 403
	// CodeNotFound: the handler does not know what the request names (a worker it has
	// forgotten, say); the asker must first tell it again.
	CodeNotFound Code = 404
	// CodeInternal: the handler failed. A plain error or a panic answers with it.
	CodeInternal Code = 500
	// CodeUnavailable: the handler cannot serve now (it is not the leader, or is
	// stopping); the same request may succeed later, here or elsewhere.
	CodeUnavailable Code = 503
)

func (c Code) Error() string { return "bus: error code " + strconv.Itoa(int(c)) }

// HeaderErrorCode carries an ERROR answer's code: micro's header, so NATS tools read it.
const HeaderErrorCode = "Nats-Service-Error-Code"

// codedError is a handler's error with the code its answer carries.
type codedError struct {
	code Code
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

// Is makes errors.Is(err, code) true for the code err answers with, on the handler's
// side as on the asker's (RemoteError.Is).
func (e *codedError) Is(target error) bool {
	c, ok := target.(Code)
	return ok && c == e.code
}

// WithCode makes err, returned by a handler, answer with code.
func WithCode(code Code, err error) error { return &codedError{code: code, err: err} }

// Errorf is WithCode(code, fmt.Errorf(format, args...)).
func Errorf(code Code, format string, args ...any) error {
	return WithCode(code, fmt.Errorf(format, args...))
}

// codeOf is the code an error answers with: CodeInternal unless WithCode says otherwise.
func codeOf(err error) Code {
	var ce *codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	return CodeInternal
}

// RemoteError is the answer of a remote handler that returned an error (or panicked).
// errors.Is(err, ErrRemote) holds for it, and errors.Is(err, code) for its Code.
type RemoteError struct {
	Path    string // the path asked
	Code    Code   // what kind of failure; CodeInternal from a peer that sent none
	Message string // the remote handler's error text
}

// Error gives the remote handler's message unchanged, so that it can be passed on to a
// client as it is.
func (e *RemoteError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrRemote) and errors.Is(err, e.Code) true.
func (e *RemoteError) Is(target error) bool {
	if target == ErrRemote {
		return true
	}
	c, ok := target.(Code)
	return ok && c == e.Code
}
