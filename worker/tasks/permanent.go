package tasks

import (
	"errors"

	"github.com/jobbus/jobbus/bus/protocol"
)

// ErrPermanent marks a failure that must not be retried: the job fails at once,
// whatever attempts it has left (like River's JobCancel and Asynq's SkipRetry). Wrap
// it (fmt.Errorf("...: %w", tasks.ErrPermanent)) or use Permanent.
var ErrPermanent = errors.New("permanent failure")

// Permanent marks err as a permanent failure; its text is err's. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

type permanentError struct{ err error }

func (e permanentError) Error() string        { return e.err.Error() }
func (e permanentError) Unwrap() error        { return e.err }
func (e permanentError) Is(target error) bool { return target == ErrPermanent }

// Declarer is a Task that declares itself to the coordinator: its payload's JSON Schema
// and its options. A Task that is not one is served by name, as the coordinator's
// catalogue already knows it (the built-ins, or a type another worker declared).
type Declarer interface {
	Declaration() protocol.TaskTypeDecl
}

// Declarations returns what a worker with this registry serves, sorted by name: a
// declaration for each Declarer, the bare name of every other task.
func (r *Registry) Declarations() []protocol.TaskTypeDecl {
	names := r.Names()
	out := make([]protocol.TaskTypeDecl, 0, len(names))
	for _, name := range names {
		t, _ := r.Lookup(name)
		d := protocol.Named(name)
		if dt, ok := t.(Declarer); ok {
			d = dt.Declaration()
			d.Name, d.Declared = name, true
		}
		out = append(out, d)
	}
	return out
}
