// Package tasks holds the task types a jobbus worker can run: the five
// built-in bounded tasks of PROTOCOL.md (SLEEP, WORD_COUNT, SHA256,
// PRIME_COUNT, FAIL) and a Registry that maps a task type name to its
// implementation.
//
// What a task type accepts is its contract, in package bus/protocol/tasktype,
// which the coordinator validates with; this package adds execution. Tasks are
// pure functions of their payload and attempt number and stop when their
// context is cancelled.
package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jobbus/jobbus/bus/protocol/tasktype"
)

// Task is one task type: its payload validation and its execution.
// Implementations must be safe for concurrent use.
type Task interface {
	// Validate reports whether payload is acceptable: nil or a *PayloadError.
	Validate(payload json.RawMessage) error
	// Run executes one attempt (1-based) of an already validated payload and
	// returns the result text, or an error whose text becomes the attempt's
	// error. It must return promptly with ctx.Err() once ctx is cancelled.
	Run(ctx context.Context, attempt int, payload json.RawMessage) (result string, err error)
}

// PayloadError reports a payload that a task type rejects.
type PayloadError = tasktype.PayloadError

var (
	// ErrUnknownTask is returned (wrapped) for a task type the registry lacks.
	ErrUnknownTask = tasktype.ErrUnknown
	// ErrDuplicateTask is returned (wrapped) when a name is registered twice.
	ErrDuplicateTask = errors.New("task type already registered")
)

// Registry maps task type names to tasks. It is safe for concurrent use.
type Registry struct {
	mu    sync.RWMutex
	tasks map[string]Task
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{tasks: make(map[string]Task)} }

// Builtins returns a new registry holding the five built-in task types.
func Builtins() *Registry {
	r := NewRegistry()
	for name, t := range builtinTasks() {
		r.tasks[name] = t
	}
	return r
}

// Register adds task t under name. It fails if name is empty, t is nil, or
// name is already registered (ErrDuplicateTask).
func (r *Registry) Register(name string, t Task) error {
	if name == "" || t == nil {
		return fmt.Errorf("register task %q: empty name or nil task", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.tasks[name]; ok {
		return fmt.Errorf("register task %q: %w", name, ErrDuplicateTask)
	}
	r.tasks[name] = t
	return nil
}

// Lookup returns the task registered under name.
func (r *Registry) Lookup(name string) (Task, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.tasks[name]
	return t, ok
}

// Names returns the registered task type names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.tasks))
	for name := range r.tasks {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Validate checks payload against task type taskType. It returns nil, a
// *PayloadError, or an error wrapping ErrUnknownTask.
func (r *Registry) Validate(taskType string, payload json.RawMessage) error {
	t, err := r.task(taskType)
	if err != nil {
		return err
	}
	return t.Validate(payload)
}

// Run runs one attempt of task type taskType. The built-in tasks re-check
// their payload, so an invalid one yields a *PayloadError rather than a panic.
func (r *Registry) Run(ctx context.Context, taskType string, attempt int, payload json.RawMessage) (string, error) {
	t, err := r.task(taskType)
	if err != nil {
		return "", err
	}
	return t.Run(ctx, attempt, payload)
}

func (r *Registry) task(taskType string) (Task, error) {
	if t, ok := r.Lookup(taskType); ok {
		return t, nil
	}
	return nil, fmt.Errorf("%w '%s' (known: %s)", ErrUnknownTask, taskType, strings.Join(r.Names(), ", "))
}
