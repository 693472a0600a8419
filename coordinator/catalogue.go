package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nats-io/nats.go"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/tasktype"
)

// The catalogue of task types: every task type a worker has declared, kept in the KV
// bucket TASK_TYPES so that it survives restarts (jobs of a known type are accepted
// while no worker of it is live). The five built-ins are not in it: their contract is
// PROTOCOL.md's (Config.TaskTypes), which no declaration can change.
//
// The catalogue has a lock of its own, so that submissions validate against it outside
// scheduler.mu; the scheduler reads options under scheduler.mu, then this lock
// (never the other way round).
type catalogue struct {
	builtins *tasktype.Set
	kv       jetstream.KeyValue
	stream   jetstream.Stream // kv's, which load reads (kvKeys)
	log      *slog.Logger

	mu    sync.RWMutex
	types map[string]*catalogued

	// declMu serialises declarations: each reads what the catalogue holds, then writes.
	declMu sync.Mutex
}

// catalogued is a task type in the catalogue, its schema compiled.
type catalogued struct {
	rec    protocol.TaskTypeRecord
	schema *jsonschema.Schema // nil: any JSON object
}

func newCatalogue(builtins *tasktype.Set, log *slog.Logger) *catalogue {
	return &catalogue{builtins: builtins, log: log, types: make(map[string]*catalogued)}
}

// open opens the TASK_TYPES bucket and reads every task type in it.
func (cat *catalogue) open(ctx context.Context, nc *nats.Conn, replicas int) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: protocol.TaskTypesBucket, Description: "jobbus task type catalogue",
		History: 1, Storage: jetstream.FileStorage, Replicas: replicas,
	})
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", protocol.TaskTypesBucket, err)
	}
	if cat.stream, err = js.Stream(ctx, "KV_"+protocol.TaskTypesBucket); err != nil {
		return fmt.Errorf("open bucket %s: %w", protocol.TaskTypesBucket, err)
	}
	cat.kv = kv
	return cat.load(ctx)
}

// load reads every task type in the bucket. A worker may declare one meanwhile (on a
// deposed leader, or a served mark in its background), so the keys are not listed
// with kv.ListKeys, which can miss one then (kvKeys).
func (cat *catalogue) load(ctx context.Context) error {
	loaded := make(map[string]*catalogued)
	err := kvKeys(ctx, cat.stream, "$KV."+protocol.TaskTypesBucket+".", ">", func(name string) error {
		e, err := cat.kv.Get(ctx, name)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read task type %s: %w", name, err)
		}
		var rec protocol.TaskTypeRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			cat.log.Warn("task type record unreadable; ignored", "task_type", name, "err", err)
			return nil
		}
		schema, err := compileSchema(rec.Name, rec.Schema)
		if err != nil {
			cat.log.Warn("task type schema does not compile; ignored", "task_type", name, "err", err)
			return nil
		}
		loaded[rec.Name] = &catalogued{rec: rec, schema: schema}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list task types: %w", err)
	}
	cat.mu.Lock()
	cat.types = loaded
	cat.mu.Unlock()
	return nil
}

// errNoLoader refuses every $ref the catalogue's schemas make outside themselves: a
// worker's declaration must not make the coordinator read files or fetch URLs.
var errNoLoader = errors.New("schemas may only refer to themselves")

type noLoader struct{}

func (noLoader) Load(string) (any, error) { return nil, errNoLoader }

// compileSchema compiles a declared JSON Schema; nil for none.
func compileSchema(name string, raw json.RawMessage) (*jsonschema.Schema, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schema is not JSON: %w", err)
	}
	comp := jsonschema.NewCompiler()
	comp.UseLoader(noLoader{})
	url := "jobbus:///task-types/" + name + ".json"
	if err := comp.AddResource(url, doc); err != nil {
		return nil, err
	}
	return comp.Compile(url)
}

// validate checks payload against the task type's schema: nil, a *PayloadError, or an
// error wrapping tasktype.ErrUnknown.
func (cat *catalogue) validate(taskType string, payload json.RawMessage) error {
	if _, ok := cat.builtins.Lookup(taskType); ok {
		return cat.builtins.Validate(taskType, payload)
	}
	cat.mu.RLock()
	t := cat.types[taskType]
	cat.mu.RUnlock()
	if t == nil {
		return fmt.Errorf("%w '%s'", tasktype.ErrUnknown, taskType)
	}
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return &tasktype.PayloadError{Message: "Payload must be a JSON object"}
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(trimmed))
	if err != nil {
		return &tasktype.PayloadError{Message: "Payload must be a JSON object"}
	}
	if t.schema == nil {
		return nil
	}
	if err := t.schema.Validate(v); err != nil {
		return &tasktype.PayloadError{Message: describeSchemaError(err)}
	}
	return nil
}

// describeSchemaError says what is wrong with a payload and where: "at '/text':
// maxLength: got 10,001, want 10,000", or without a place for the payload as a whole
// ("missing property 'text'"). Several problems are joined with "; ".
func describeSchemaError(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	var parts []string
	schemaProblems(ve.Causes, &parts)
	if len(parts) == 0 {
		return ve.Error()
	}
	return strings.Join(parts, "; ")
}

// schemaPrinter prints the validator's texts, in English as its own errors do.
var schemaPrinter = message.NewPrinter(language.English)

// schemaProblems appends the problem each of errs and their causes states, in order,
// each once. A reference ($ref) or a group states only that its causes failed, and is
// passed over: the validator's BasicOutput instead labels the one problem under a
// $ref "validation failed" and drops the others.
func schemaProblems(errs []*jsonschema.ValidationError, parts *[]string) {
	for _, e := range errs {
		switch e.ErrorKind.(type) {
		case *kind.Reference, *kind.Group:
		default:
			msg := e.ErrorKind.LocalizedString(schemaPrinter)
			if len(e.InstanceLocation) > 0 {
				msg = fmt.Sprintf("at '%s': %s", jsonPointer(e.InstanceLocation), msg)
			}
			if !slices.Contains(*parts, msg) {
				*parts = append(*parts, msg)
			}
		}
		schemaProblems(e.Causes, parts)
	}
}

// jsonPointer is the JSON Pointer (RFC 6901) of a place in the payload.
func jsonPointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(pointerEscaper.Replace(t))
	}
	return b.String()
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

func (cat *catalogue) isBuiltin(name string) bool {
	_, ok := cat.builtins.Lookup(name)
	return ok
}

// options returns taskType's options (zero for a built-in or unknown type).
func (cat *catalogue) options(taskType string) protocol.TaskTypeOptions {
	cat.mu.RLock()
	defer cat.mu.RUnlock()
	if t := cat.types[taskType]; t != nil {
		return t.rec.Options
	}
	return protocol.TaskTypeOptions{}
}

// records returns a copy of every catalogued type's record, by name.
func (cat *catalogue) records() map[string]protocol.TaskTypeRecord {
	cat.mu.RLock()
	defer cat.mu.RUnlock()
	out := make(map[string]protocol.TaskTypeRecord, len(cat.types))
	for name, t := range cat.types {
		out[name] = t.rec
	}
	return out
}

// errRegistration is the text of a registration refused for its task types.
func errRegistration(format string, args ...any) error {
	return bus.WithCode(bus.CodeBadRequest, &protocol.Error{
		Message: "Registration refused: " + fmt.Sprintf(format, args...)})
}

// declare records the task types a registering worker serves: a declaration sets the
// type's schema and options, a bare name of an unknown type catalogues it with no
// schema (any JSON object), and every type the worker serves is marked served now.
// It returns once the catalogue is durable, so the types of a registered worker are
// known after a restart. The error is a registration refusal (bus.CodeBadRequest) or a
// KV failure.
func (cat *catalogue) declare(ctx context.Context, workerID string, decls []protocol.TaskTypeDecl, now time.Time) error {
	type compiled struct {
		decl   protocol.TaskTypeDecl
		schema *jsonschema.Schema
	}
	var custom []compiled
	seen := make(map[string]bool, len(decls))
	for _, d := range decls {
		if err := protocol.CheckTaskTypeName(d.Name); err != nil {
			return errRegistration("%v", err)
		}
		if seen[d.Name] {
			return errRegistration("task type %s listed twice", d.Name)
		}
		seen[d.Name] = true
		if _, builtin := cat.builtins.Lookup(d.Name); builtin {
			if d.Declared {
				return errRegistration("task type %s is built in: its payload and options are PROTOCOL.md's", d.Name)
			}
			continue
		}
		if b := protocol.TypedTaskType(d.Name); d.Declared && cat.isBuiltin(b) {
			// The CLI reads sleep and word-count as the built-ins: a type of that name
			// could never be submitted from it.
			return errRegistration("task type %s reads as %s, a built-in (the CLI takes any case, and - for _): name it otherwise", d.Name, b)
		}
		if err := d.Options.Check(); err != nil {
			return errRegistration("task type %s: %v", d.Name, err)
		}
		schema, err := compileSchema(d.Name, d.Schema)
		if err != nil {
			return errRegistration("task type %s: schema: %v", d.Name, err)
		}
		custom = append(custom, compiled{d, schema})
	}
	if len(custom) == 0 {
		return nil
	}
	cat.declMu.Lock()
	defer cat.declMu.Unlock()
	updated := make(map[string]*catalogued, len(custom))
	for _, c := range custom {
		cat.mu.RLock()
		old := cat.types[c.decl.Name]
		cat.mu.RUnlock()
		t := &catalogued{}
		switch {
		case c.decl.Declared:
			t.rec = protocol.TaskTypeRecord{Name: c.decl.Name, Schema: compact(c.decl.Schema),
				Options: c.decl.Options, DeclaredBy: workerID, UpdatedAtMillis: now.UnixMilli()}
			t.schema = c.schema
			if old != nil && bytes.Equal(old.rec.Schema, t.rec.Schema) && old.rec.Options == t.rec.Options {
				t.rec.DeclaredBy, t.rec.UpdatedAtMillis = old.rec.DeclaredBy, old.rec.UpdatedAtMillis
			} else if old != nil {
				cat.log.Info("task type redeclared", "task_type", c.decl.Name, "worker", workerID)
			}
		case old != nil:
			*t = *old
		default:
			t.rec = protocol.TaskTypeRecord{Name: c.decl.Name, DeclaredBy: workerID, UpdatedAtMillis: now.UnixMilli()}
		}
		t.rec.LastServedMillis = now.UnixMilli()
		if err := cat.put(ctx, t.rec); err != nil {
			return err
		}
		updated[c.decl.Name] = t
	}
	cat.mu.Lock()
	maps.Copy(cat.types, updated)
	cat.mu.Unlock()
	return nil
}

// served marks types as served until now (their last worker left), in the background
// of its caller: a best-effort note for `jobbus types`.
func (cat *catalogue) served(ctx context.Context, types []string, now time.Time) {
	cat.declMu.Lock()
	defer cat.declMu.Unlock()
	for _, name := range types {
		cat.mu.RLock()
		old := cat.types[name]
		cat.mu.RUnlock()
		if old == nil {
			continue
		}
		t := *old
		t.rec.LastServedMillis = now.UnixMilli()
		if err := cat.put(ctx, t.rec); err != nil {
			cat.log.Debug("task type not marked served", "task_type", name, "err", err)
			return
		}
		cat.mu.Lock()
		cat.types[name] = &t
		cat.mu.Unlock()
	}
}

func (cat *catalogue) put(ctx context.Context, rec protocol.TaskTypeRecord) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode task type %s: %w", rec.Name, err)
	}
	if _, err := cat.kv.Put(ctx, rec.Name, data); err != nil {
		return bus.WithCode(bus.CodeUnavailable, fmt.Errorf("store task type %s: %w", rec.Name, err))
	}
	return nil
}

// compact is raw without insignificant space, so equal schemas compare equal.
func compact(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}
