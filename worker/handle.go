package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/invopop/jsonschema"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/worker/tasks"
)

// Functions: task types of a worker's own. A worker registers a handler under a task
// type name; it declares the type (its payload's JSON Schema and options) when it
// registers with the coordinator, which catalogues it, validates every submission of it
// before the job exists, and assigns its jobs only to workers that serve it.
//
//	w, _ := worker.Connect(ctx, url)
//	worker.HandleJSON(w, "TEXT_REVERSE", func(ctx context.Context, attempt int, a Args) (string, error) {
//		return reverse(a.Text), nil
//	}, worker.Concurrency(4))
//	w.Run(ctx)

// Handler runs one attempt (numbered from 1) of a job of its task type, with the job's
// payload, and returns the result text or the error that fails the attempt. ctx ends
// when the coordinator cancels the attempt, its execution deadline passes or the worker
// stops; the handler must then return promptly. A failure is retried while the job has
// attempts left, unless it is permanent (Permanent, ErrPermanent).
type Handler func(ctx context.Context, attempt int, payload json.RawMessage) (string, error)

// ErrPermanent marks a failure that must not be retried; see tasks.ErrPermanent.
var ErrPermanent = tasks.ErrPermanent

// Permanent marks err as a permanent failure: the job fails at once, whatever attempts
// it has left.
func Permanent(err error) error { return tasks.Permanent(err) }

// Snooze is what a handler returns to run its job again after d instead of now,
// without using an attempt (River's JobSnooze): the job goes back to SCHEDULED for d,
// its attempts unchanged and its snooze count one higher, and its history shows it.
//
//	if !ready(a) {
//		return "", worker.Snooze(30 * time.Second)
//	}
func Snooze(d time.Duration) error { return tasks.Snooze(d) }

// ErrBadHandler is returned (wrapped) for a handler that cannot be registered.
var ErrBadHandler = errors.New("worker: bad handler")

// TypeOption sets what a task type declares besides its name.
type TypeOption func(*protocol.TaskTypeDecl)

// Schema sets the JSON Schema the type's payloads must satisfy (default for Handle: any
// JSON object; for HandleJSON: derived from the argument struct).
func Schema(schema json.RawMessage) TypeOption {
	return func(d *protocol.TaskTypeDecl) { d.Schema = schema }
}

// MaxAttempts sets the type's attempts for submissions that ask for none (default: the
// coordinator's --max-attempts).
func MaxAttempts(n int) TypeOption {
	return func(d *protocol.TaskTypeDecl) { d.Options.MaxAttempts = n }
}

// Timeout sets the execution deadline of one attempt of the type in whole
// milliseconds, one under a millisecond rounded up to 1 ms. 0 or a negative d is the
// default, the coordinator's --task-timeout-millis, as MaxAttempts(0) and
// Concurrency(0) are theirs.
func Timeout(d time.Duration) TypeOption {
	return func(decl *protocol.TaskTypeDecl) {
		decl.Options.TimeoutMillis = 0
		if d > 0 {
			decl.Options.TimeoutMillis = max(1, d.Milliseconds())
		}
	}
}

// Concurrency bounds how many jobs of the type run at once across all workers (default
// 0: unbounded). The coordinator holds it exactly, since it makes every assignment.
func Concurrency(n int) TypeOption {
	return func(d *protocol.TaskTypeDecl) { d.Options.Concurrency = n }
}

// ConcurrencyKeyFrom takes a submission's concurrency key, when it names none, from
// its payload at the JSON Pointer ptr ("/customer/id"): a string, or a number as
// written. A payload where ptr does not resolve is refused at submission.
func ConcurrencyKeyFrom(ptr string) TypeOption {
	return func(d *protocol.TaskTypeDecl) { d.Options.ConcurrencyKey = ptr }
}

// KeyConcurrency bounds how many jobs of the type that share a concurrency key run at
// once in their queue (default 0: the queue's setting, else unbounded).
func KeyConcurrency(n int) TypeOption {
	return func(d *protocol.TaskTypeDecl) { d.Options.KeyConcurrency = n }
}

// Handle registers h under taskType: the worker serves that task type from the next
// registration on. Call it before Run. The type's payloads are any JSON object unless
// Schema says otherwise.
func (w *Worker) Handle(taskType string, h Handler, opts ...TypeOption) error {
	if h == nil {
		return fmt.Errorf("%w: nil handler for %s", ErrBadHandler, taskType)
	}
	return w.handleTask(taskType, h, nil, opts)
}

// HandleJSON registers a typed handler under taskType: each payload is decoded into A
// (with encoding/json) before h runs, and the type's schema is derived from A (with
// github.com/invopop/jsonschema: fields without omitempty are required, and tags such as
// `jsonschema:"maxLength=10000"` add constraints) unless Schema gives one. A payload
// that does not decode fails its job permanently.
func HandleJSON[A any](w *Worker, taskType string, h func(ctx context.Context, attempt int, args A) (string, error), opts ...TypeOption) error {
	if h == nil {
		return fmt.Errorf("%w: nil handler for %s", ErrBadHandler, taskType)
	}
	schema, err := SchemaFor[A]()
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadHandler, taskType, err)
	}
	run := func(ctx context.Context, attempt int, payload json.RawMessage) (string, error) {
		var args A
		if err := json.Unmarshal(payload, &args); err != nil {
			var whole A
			if !refusedNumber(err) || decodeWhole(payload, &whole) != nil {
				return "", Permanent(fmt.Errorf("decode payload: %w", err))
			}
			args = whole // 2.0 or 1e3 for an integer field (numbers.go)
		}
		return h(ctx, attempt, args)
	}
	return w.handleTask(taskType, run, schema, opts)
}

// SchemaFor derives the JSON Schema of A, a struct, as HandleJSON declares it: its
// properties from the json tags, fields without omitempty required, constraints from
// jsonschema tags, other properties allowed (as encoding/json ignores them). A type
// that contains itself (a tree) refers to its definitions ($defs) where the others are
// written out in place.
func SchemaFor[A any]() (json.RawMessage, error) {
	r := &jsonschema.Reflector{DoNotReference: true, ExpandedStruct: true, AllowAdditionalProperties: true,
		Mapper: integerRange}
	if recursive(reflect.TypeFor[A](), map[reflect.Type]walk{}) {
		// Inlined, a type that contains itself (a tree's children) never ends: the
		// reflector overflows the stack, which kills the process. Such a type refers to
		// its definitions ($defs) instead.
		r.DoNotReference, r.ExpandedStruct = false, false
	}
	s := r.Reflect(new(A))
	if schemaType(s) != "object" {
		return nil, fmt.Errorf("payload type %T is not a struct", *new(A))
	}
	// The coordinator's default draft (2020-12) either way; and no $id, which would name
	// the Go package, not the task type.
	s.Version, s.ID = "", ""
	return json.Marshal(s)
}

// recursive reports whether t contains itself, through fields (as encoding/json
// reads them), pointers, slices, arrays or map values: a depth-first walk in which
// seen marks the types on its path (walking) and those it cleared (done), so that a
// type shared by many fields is walked once.
func recursive(t reflect.Type, seen map[reflect.Type]walk) bool {
	switch seen[t] {
	case walking:
		return true
	case done:
		return false
	}
	seen[t] = walking
	var inner []reflect.Type
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
		inner = append(inner, t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if f := t.Field(i); f.IsExported() || f.Anonymous {
				inner = append(inner, f.Type)
			}
		}
	}
	for _, it := range inner {
		if recursive(it, seen) {
			return true
		}
	}
	seen[t] = done
	return false
}

// walk is a type's mark in recursive's walk; the zero value is a type not yet seen.
type walk uint8

const (
	walking walk = iota + 1
	done
)

// schemaType is the type of the value s describes: its own, or that of the
// definition it refers to.
func schemaType(s *jsonschema.Schema) string {
	if name, ok := strings.CutPrefix(s.Ref, "#/$defs/"); ok && s.Definitions[name] != nil {
		return s.Definitions[name].Type
	}
	return s.Type
}

func (w *Worker) handleTask(taskType string, run Handler, schema json.RawMessage, opts []TypeOption) error {
	if w.started.Load() {
		return fmt.Errorf("%w: Handle(%s) after Run: the coordinator has the registration already", ErrBadHandler, taskType)
	}
	if err := protocol.CheckTaskTypeName(taskType); err != nil {
		return fmt.Errorf("%w: %v", ErrBadHandler, err)
	}
	decl := protocol.TaskTypeDecl{Name: taskType, Schema: schema, Declared: true}
	for _, o := range opts {
		o(&decl)
	}
	if err := decl.Options.Check(); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadHandler, taskType, err)
	}
	if err := w.cfg.Registry.Register(taskType, funcTask{decl: decl, run: run}); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// funcTask is a handler as a tasks.Task that declares itself.
type funcTask struct {
	decl protocol.TaskTypeDecl
	run  Handler
}

// Validate accepts every payload: the coordinator validated it against the schema
// before the job existed.
func (funcTask) Validate(json.RawMessage) error { return nil }

func (t funcTask) Run(ctx context.Context, attempt int, payload json.RawMessage) (string, error) {
	return t.run(ctx, attempt, payload)
}

func (t funcTask) Declaration() protocol.TaskTypeDecl { return t.decl }
