package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"
)

// Task types beyond the five built-ins (a native extension; spec peers never see it).
// A worker declares the task types it serves in its WORKER_REGISTER; the coordinator
// keeps them in a catalogue (KV bucket TaskTypesBucket), validates submissions of each
// against its declared JSON Schema and routes its jobs only to workers that serve it.

// TaskTypesBucket maps a task type name to its TaskTypeRecord.
const TaskTypesBucket = "TASK_TYPES"

// MaxTaskTypeName bounds a task type's name.
const MaxTaskTypeName = 128

var taskTypeName = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// ErrBadTaskTypeName is returned (wrapped) by CheckTaskTypeName.
var ErrBadTaskTypeName = errors.New("bad task type name")

// CheckTaskTypeName reports whether name can name a task type: 1 to MaxTaskTypeName
// characters of A-Z, a-z, 0-9, '_', '.' and '-' (it is a KV key).
func CheckTaskTypeName(name string) error {
	if len(name) == 0 || len(name) > MaxTaskTypeName || !taskTypeName.MatchString(name) {
		return fmt.Errorf("%w %q: 1 to %d characters of A-Z, a-z, 0-9, '_', '.', '-'",
			ErrBadTaskTypeName, name, MaxTaskTypeName)
	}
	return nil
}

// TypedTaskType is the task type a name typed on the command line stands for: any
// case, and kebab-case for snake case (word-count is WORD_COUNT). A declared type whose
// name reads as a built-in this way is refused, since the CLI sends it to the built-in.
func TypedTaskType(typed string) string {
	return strings.ToUpper(strings.ReplaceAll(typed, "-", "_"))
}

// TaskTypeOptions are a task type's own scheduling options; zero means the
// coordinator's default.
type TaskTypeOptions struct {
	// MaxAttempts is used for submissions of the type with maxAttempts <= 0.
	MaxAttempts int `json:"maxAttempts,omitempty"`
	// TimeoutMillis is the execution deadline of one attempt.
	TimeoutMillis int64 `json:"timeoutMillis,omitempty"`
	// Concurrency bounds the type's RUNNING jobs across all workers; 0 is unbounded.
	Concurrency int `json:"concurrency,omitempty"`
	// ConcurrencyKey is a JSON Pointer (RFC 6901) into the payload: a submission of the
	// type that names no concurrency key takes the string (or number) it points at as
	// its key, and is refused when it points at nothing (queues.go).
	ConcurrencyKey string `json:"concurrencyKey,omitempty"`
	// KeyConcurrency bounds the RUNNING jobs of the type's queue that share one
	// concurrency key; 0 leaves it to the queue's setting (unbounded by default).
	KeyConcurrency int `json:"keyConcurrency,omitempty"`
}

// MaxTimeoutMillis is the longest TimeoutMillis: the most whole milliseconds a
// time.Duration holds (about 292 years). A longer one would wrap round to a deadline
// already past, and every attempt of the type would time out at once.
const MaxTimeoutMillis = int64(math.MaxInt64 / time.Millisecond)

// Check returns every problem of o at once.
func (o TaskTypeOptions) Check() error {
	var errs []error
	if o.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("maxAttempts must not be negative, got %d", o.MaxAttempts))
	}
	if o.TimeoutMillis < 0 || o.TimeoutMillis > MaxTimeoutMillis {
		errs = append(errs, fmt.Errorf("timeoutMillis must be in 0..%d, got %d", MaxTimeoutMillis, o.TimeoutMillis))
	}
	if o.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("concurrency must not be negative, got %d", o.Concurrency))
	}
	if o.ConcurrencyKey != "" {
		if err := CheckJSONPointer(o.ConcurrencyKey); err != nil {
			errs = append(errs, fmt.Errorf("concurrencyKey: %w", err))
		}
	}
	if o.KeyConcurrency < 0 || o.KeyConcurrency > MaxKeyConcurrency {
		errs = append(errs, fmt.Errorf("keyConcurrency must be in 0..%d, got %d", MaxKeyConcurrency, o.KeyConcurrency))
	}
	return errors.Join(errs...)
}

// TaskTypeDecl is one element of WORKER_REGISTER's taskTypes: the name of a task type
// the worker serves, written as a bare JSON string, or a declaration of it, written as
// an object {"name", "schema", "options"}. A declaration sets the type's payload
// schema (a JSON Schema; absent: any JSON object) and options in the coordinator's
// catalogue; a bare name serves a type as the catalogue already knows it.
type TaskTypeDecl struct {
	Name    string          `json:"name"`
	Schema  json.RawMessage `json:"schema,omitempty"`
	Options TaskTypeOptions `json:"options,omitzero"`
	// Declared is true when the element was an object: a declaration, which replaces
	// what the catalogue held, rather than a bare name.
	Declared bool `json:"-"`
}

// Named is a bare task type name, as a worker serving a known type sends it.
func Named(name string) TaskTypeDecl { return TaskTypeDecl{Name: name} }

// Names returns the names of decls.
func Names(decls []TaskTypeDecl) []string {
	out := make([]string, len(decls))
	for i, d := range decls {
		out[i] = d.Name
	}
	return out
}

// MarshalJSON writes a bare name as a string, a declaration as an object.
func (d TaskTypeDecl) MarshalJSON() ([]byte, error) {
	if !d.Declared && d.Schema == nil && d.Options == (TaskTypeOptions{}) {
		return json.Marshal(d.Name)
	}
	type plain TaskTypeDecl
	return json.Marshal(plain(d))
}

// UnmarshalJSON reads a string or an object.
func (d *TaskTypeDecl) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case len(b) > 0 && b[0] == '"':
		*d = TaskTypeDecl{}
		return json.Unmarshal(b, &d.Name)
	case len(b) > 0 && b[0] == '{':
		type plain TaskTypeDecl
		var p plain
		if err := json.Unmarshal(b, &p); err != nil {
			return err
		}
		*d = TaskTypeDecl(p)
		d.Declared = true
		if string(bytes.TrimSpace(d.Schema)) == "null" {
			d.Schema = nil
		}
		return nil
	}
	return errors.New("field 'taskTypes' must hold task type names (strings) or declarations (objects)")
}

// TaskTypeRecord is a task type in the catalogue (KV bucket TaskTypesBucket, key = its
// name), a published schema: fields are only added.
type TaskTypeRecord struct {
	Name    string          `json:"name"`
	Schema  json.RawMessage `json:"schema,omitempty"`
	Options TaskTypeOptions `json:"options"`
	// DeclaredBy is the worker whose registration last declared it.
	DeclaredBy string `json:"declaredBy,omitempty"`
	// UpdatedAtMillis is when the declaration last changed.
	UpdatedAtMillis int64 `json:"updatedAtMillis"`
	// LastServedMillis is when a worker serving it last registered, or left.
	LastServedMillis int64 `json:"lastServedMillis"`
}

// ListTaskTypes asks for the catalogue (a native extension).
type ListTaskTypes struct{}

// TaskTypeList answers ListTaskTypes, sorted by name: the built-ins first.
type TaskTypeList struct {
	TaskTypes []TaskTypeInfo `json:"taskTypes"`
}

// TaskTypeInfo is one task type as the coordinator sees it now.
type TaskTypeInfo struct {
	Name    string          `json:"name"`
	Builtin bool            `json:"builtin"`
	Schema  json.RawMessage `json:"schema,omitempty"`
	Options TaskTypeOptions `json:"options"`
	// Workers are the live workers serving it, sorted.
	Workers          []string `json:"workers"`
	Queued           int      `json:"queued"`
	Running          int      `json:"running"`
	LastServedMillis int64    `json:"lastServedMillis,omitempty"`
}

func (ListTaskTypes) MessageType() Type { return TypeListTaskTypes }
func (TaskTypeList) MessageType() Type  { return TypeTaskTypeList }

func (m ListTaskTypes) MarshalJSON() ([]byte, error) {
	return encode(m.MessageType(), struct{}{})
}

func (m TaskTypeList) MarshalJSON() ([]byte, error) {
	type plain TaskTypeList
	if m.TaskTypes == nil {
		m.TaskTypes = []TaskTypeInfo{}
	}
	for i := range m.TaskTypes {
		if m.TaskTypes[i].Workers == nil {
			m.TaskTypes[i].Workers = []string{}
		}
	}
	return encode(m.MessageType(), plain(m))
}
