// Package tasktype is the contract of task types apart from their execution: a task
// type's name and what payloads it accepts. The coordinator validates submissions with
// it before a job exists; workers (package worker/tasks) pair each type with the code
// that runs it. The five built-in types of PROTOCOL.md live here with their exact
// validation texts.
package tasktype

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Validator checks a task type's payload: nil, or a *PayloadError.
type Validator interface {
	Validate(payload json.RawMessage) error
}

// PayloadError reports a payload that a task type rejects.
type PayloadError struct {
	// Message is the reason, e.g. "Field 'durationMillis' must be an integer".
	Message string
}

// Error is the wire text of PROTOCOL.md, "Invalid payload: <Message>", as the
// protocol package writes it.
func (e *PayloadError) Error() string { return protocol.InvalidPayload(e.Message).Message }

// ErrUnknown is returned (wrapped) for a task type a Set lacks.
var ErrUnknown = errors.New("unknown task type")

// Set maps task type names to their validators. It is immutable once built, so it is
// safe for concurrent use.
type Set struct{ types map[string]Validator }

// NewSet returns a set of the given types.
func NewSet(types map[string]Validator) *Set { return &Set{types: maps.Clone(types)} }

// Builtins is the set of the five built-in task types.
func Builtins() *Set {
	return NewSet(map[string]Validator{
		Sleep.Name: Sleep, WordCount.Name: WordCount, SHA256.Name: SHA256,
		PrimeCount.Name: PrimeCount, Fail.Name: Fail,
	})
}

// Names returns the task type names, sorted.
func (s *Set) Names() []string { return slices.Sorted(maps.Keys(s.types)) }

// Validate checks payload against task type taskType. It returns nil, a
// *PayloadError, or an error wrapping ErrUnknown.
func (s *Set) Validate(taskType string, payload json.RawMessage) error {
	v, ok := s.types[taskType]
	if !ok {
		return fmt.Errorf("%w '%s' (known: %s)", ErrUnknown, taskType, strings.Join(s.Names(), ", "))
	}
	return v.Validate(payload)
}

// Builtin is a built-in task type: its name and the parser of its payload into the
// arguments its code runs on (A).
type Builtin[A any] struct {
	Name string
	// parse reads the arguments from a payload.
	parse func(o object) (A, *PayloadError)
}

// Args parses payload into the task's arguments, or fails with a *PayloadError.
func (b Builtin[A]) Args(payload json.RawMessage) (A, error) {
	o, perr := parseObject(payload)
	if perr == nil {
		var a A
		if a, perr = b.parse(o); perr == nil {
			return a, nil
		}
	}
	var zero A
	return zero, perr
}

// Validate reports whether payload parses.
func (b Builtin[A]) Validate(payload json.RawMessage) error {
	_, err := b.Args(payload)
	return err
}

// Bounds of the built-in payloads (PROTOCOL.md, "Task payloads"). They exist so that
// no job can monopolise a worker.
const (
	MaxSleepMillis      = 600_000
	MaxTextChars        = 200_000
	MinPrimeLimit       = 2
	MaxPrimeLimit       = 50_000_000
	MaxFailUntilAttempt = 1000
)

// Names of the built-in task types.
const (
	TypeSleep      = "SLEEP"
	TypeWordCount  = "WORD_COUNT"
	TypeSHA256     = "SHA256"
	TypePrimeCount = "PRIME_COUNT"
	TypeFail       = "FAIL"
)

// The five built-in task types.
var (
	// Sleep waits durationMillis (0..600000).
	Sleep = Builtin[int64]{Name: TypeSleep, parse: func(o object) (int64, *PayloadError) {
		return o.intField("durationMillis", 0, MaxSleepMillis)
	}}
	// WordCount counts the whitespace-separated words of text. Args gives its UTF-8
	// bytes, as SHA256's.
	WordCount = Builtin[[]byte]{Name: TypeWordCount, parse: textField}
	// SHA256 hashes the UTF-8 bytes of text. Args gives them, as a slice of the
	// payload when the text is its own JSON (every job's: no copy), so read-only.
	SHA256 = Builtin[[]byte]{Name: TypeSHA256, parse: textField}
	// PrimeCount counts the primes below limit (2..50000000).
	PrimeCount = Builtin[int64]{Name: TypePrimeCount, parse: func(o object) (int64, *PayloadError) {
		return o.intField("limit", MinPrimeLimit, MaxPrimeLimit)
	}}
	// Fail fails every attempt before failUntilAttempt (0..1000).
	Fail = Builtin[int64]{Name: TypeFail, parse: func(o object) (int64, *PayloadError) {
		return o.intField("failUntilAttempt", 0, MaxFailUntilAttempt)
	}}
)

// textField reads the text of WORD_COUNT and SHA256.
func textField(o object) ([]byte, *PayloadError) {
	return o.bytesField("text", MaxTextChars)
}

// Lookup returns the validator of task type name.
func (s *Set) Lookup(name string) (Validator, bool) {
	v, ok := s.types[name]
	return v, ok
}
