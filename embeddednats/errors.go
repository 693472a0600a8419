package embeddednats

import "errors"

// Sentinel errors. Match them with errors.Is; the returned errors carry a
// message that names the address or directory involved and the fix.
var (
	// ErrPortInUse means a listen address (client or cluster) is taken.
	ErrPortInUse = errors.New("port in use")
	// ErrStoreLocked means another server holds the store directory.
	ErrStoreLocked = errors.New("store directory is locked by another server")
	// ErrNoJetStream means the NATS server reached by Dial has no JetStream.
	ErrNoJetStream = errors.New("JetStream is not enabled")
	// ErrNoJetStreamAccess means the user Dial connects as may not use JetStream's API.
	ErrNoJetStreamAccess = errors.New("no permission to use JetStream")
)

// hintError carries a full, human-oriented message while still matching a
// sentinel (and the underlying cause, if any) through errors.Is.
type hintError struct {
	msg      string
	sentinel error
	cause    error
}

func (e *hintError) Error() string { return e.msg }

func (e *hintError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.sentinel}
	}
	return []error{e.sentinel, e.cause}
}
