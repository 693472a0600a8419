package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Named queues (a native extension). A job goes to a queue (SubmitJob.Queue; absent:
// DefaultQueue), which exists from its first use. A worker serves queues with weights,
// or in strict order (WorkerRegister.Queues, .StrictQueues; absent: DefaultQueue only,
// as a spec peer does). A queue's settings (pause, max running, per-key concurrency)
// are durable: the controls bucket holds them under QueueControlPrefix + name.

// DefaultQueue is the queue of a job that names none, and what a worker that names
// none serves.
const DefaultQueue = "default"

// HeaderQueue is a header of a stored SCHEDULED record: its job's queue, DefaultQueue
// included. Recovery knows a job due far ahead by its record's headers only, and learns
// from it which queues hold jobs not yet finished; a SCHEDULED record without it was
// written by an older release, and is read whole.
const HeaderQueue = "Jobbus-Queue"

// QueueControlPrefix starts the key of a queue's QueueSettings in the controls bucket.
const QueueControlPrefix = "queue."

// Bounds of queues and concurrency keys.
const (
	MaxQueueName       = 64
	MaxQueueWeight     = 1000
	MaxWorkerQueues    = 64
	MaxConcurrencyKey  = 256
	MaxKeyConcurrency  = 1 << 20
	MaxQueueMaxRunning = 1 << 20
)

// ErrBadQueue is returned (wrapped) for a queue name, weight or list that cannot be used.
var ErrBadQueue = errors.New("bad queue")

// QueueOf is the queue a job or request naming name goes to: name, or DefaultQueue for "".
func QueueOf(name string) string {
	if name == "" {
		return DefaultQueue
	}
	return name
}

// CheckQueueName reports whether name can name a queue: 1 to MaxQueueName characters of
// A-Z, a-z, 0-9, '_' and '-' (it is a token of a KV key and of a metric label).
func CheckQueueName(name string) error {
	ok := len(name) > 0 && len(name) <= MaxQueueName
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	if !ok {
		return fmt.Errorf("%w name %q: 1 to %d characters of A-Z, a-z, 0-9, '_', '-'", ErrBadQueue, name, MaxQueueName)
	}
	return nil
}

// CheckConcurrencyKey reports whether k can be a job's concurrency key: 1 to
// MaxConcurrencyKey bytes.
func CheckConcurrencyKey(k string) error {
	if k == "" || len(k) > MaxConcurrencyKey {
		return fmt.Errorf("concurrency key must be 1 to %d bytes, got %d", MaxConcurrencyKey, len(k))
	}
	return nil
}

// QueueWeight is a queue a worker serves and its weight: of the starts a worker takes
// while all its queues have jobs, each queue gets its weight's share. On the wire it is
// a bare name (weight 1) or {"name", "weight"}.
type QueueWeight struct {
	Name   string `json:"name"`
	Weight int    `json:"weight"`
}

// MarshalJSON writes weight 1 as a bare name.
func (q QueueWeight) MarshalJSON() ([]byte, error) {
	if q.Weight == 1 {
		return json.Marshal(q.Name)
	}
	type plain QueueWeight
	return json.Marshal(plain(q))
}

// UnmarshalJSON reads a name or an object; an object without a weight has weight 1.
func (q *QueueWeight) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case len(b) > 0 && b[0] == '"':
		*q = QueueWeight{Weight: 1}
		return json.Unmarshal(b, &q.Name)
	case len(b) > 0 && b[0] == '{':
		type plain QueueWeight
		p := plain{Weight: 1}
		if err := json.Unmarshal(b, &p); err != nil {
			return err
		}
		*q = QueueWeight(p)
		return nil
	}
	return errors.New("field 'queues' must hold queue names (strings) or {\"name\", \"weight\"} objects")
}

// CheckQueueWeights returns every problem of a worker's queue list at once: each name
// valid and listed once, each weight in 1..MaxQueueWeight, at most MaxWorkerQueues.
func CheckQueueWeights(qs []QueueWeight) error {
	var errs []error
	if len(qs) > MaxWorkerQueues {
		errs = append(errs, fmt.Errorf("%w list: at most %d queues, got %d", ErrBadQueue, MaxWorkerQueues, len(qs)))
	}
	seen := make(map[string]bool, len(qs))
	for _, q := range qs {
		if err := CheckQueueName(q.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[q.Name] {
			errs = append(errs, fmt.Errorf("%w list: queue %s listed twice", ErrBadQueue, q.Name))
		}
		seen[q.Name] = true
		if q.Weight < 1 || q.Weight > MaxQueueWeight {
			errs = append(errs, fmt.Errorf("%w weight of %s: must be in 1..%d, got %d", ErrBadQueue, q.Name, MaxQueueWeight, q.Weight))
		}
	}
	return errors.Join(errs...)
}

// ParseQueueWeights reads a worker's queues as a flag writes them: comma-separated
// names, each with an optional =weight ("critical=6,default=3,low=1"; "a,b": weight 1
// each). The order is kept: it is the order of --strict-queues.
func ParseQueueWeights(spec string) ([]QueueWeight, error) {
	var out []QueueWeight
	for part := range strings.SplitSeq(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, fmt.Errorf("%w list %q: an empty element", ErrBadQueue, spec)
		}
		name, weight, hasWeight := strings.Cut(part, "=")
		q := QueueWeight{Name: strings.TrimSpace(name), Weight: 1}
		if hasWeight {
			n, err := strconv.Atoi(strings.TrimSpace(weight))
			if err != nil {
				return nil, fmt.Errorf("%w weight of %s: %q is not an integer", ErrBadQueue, q.Name, weight)
			}
			q.Weight = n
		}
		out = append(out, q)
	}
	if err := CheckQueueWeights(out); err != nil {
		return nil, err
	}
	return out, nil
}

// FormatQueueWeights writes qs as ParseQueueWeights reads them.
func FormatQueueWeights(qs []QueueWeight) string {
	parts := make([]string, len(qs))
	for i, q := range qs {
		parts[i] = q.Name + "=" + strconv.Itoa(q.Weight)
	}
	return strings.Join(parts, ",")
}

// QueueSettings are a queue's durable settings, the JSON value of its control
// (QueueControlPrefix + name). Zero values are the defaults: running, no limits.
type QueueSettings struct {
	// Paused: the queue accepts jobs and starts none.
	Paused bool `json:"paused,omitempty"`
	// MaxRunning bounds the queue's RUNNING jobs across all workers; 0 is unbounded.
	MaxRunning int `json:"maxRunning,omitempty"`
	// KeyConcurrency bounds the RUNNING jobs of one concurrency key in the queue, for
	// the task types whose options set no KeyConcurrency of their own; 0 is unbounded.
	KeyConcurrency int `json:"keyConcurrency,omitempty"`
}

// Check returns every problem of s at once.
func (s QueueSettings) Check() error {
	var errs []error
	if s.MaxRunning < 0 || s.MaxRunning > MaxQueueMaxRunning {
		errs = append(errs, fmt.Errorf("maxRunning must be in 0..%d (0: unbounded), got %d", MaxQueueMaxRunning, s.MaxRunning))
	}
	if s.KeyConcurrency < 0 || s.KeyConcurrency > MaxKeyConcurrency {
		errs = append(errs, fmt.Errorf("keyConcurrency must be in 0..%d (0: unbounded), got %d", MaxKeyConcurrency, s.KeyConcurrency))
	}
	return errors.Join(errs...)
}

// QueueInfo is one queue as the leading coordinator sees it now.
type QueueInfo struct {
	Name string `json:"name"`
	QueueSettings
	// Queued is the queue's depth: its QUEUED jobs.
	Queued  int `json:"queued"`
	Running int `json:"running"`
	// Unfinished is its jobs not finished, in any state: QUEUED and RUNNING ones, and
	// those due later (SCHEDULED), waiting on other jobs (WAITING) or on a retry
	// (RETRY_WAIT). A queue with none QUEUED or RUNNING may hold those.
	Unfinished int `json:"unfinished"`
	// Keys is how many concurrency keys its queued jobs carry (unkeyed jobs are one).
	Keys int `json:"keys"`
	// Workers is how many live workers serve it.
	Workers int `json:"workers"`
	// Started and Throttled count since this coordinator took the lead: attempts
	// started, and dispatch passes that found the queue's next job held back by a
	// limit (a rate limit, or MaxRunning reached).
	Started   uint64 `json:"started"`
	Throttled uint64 `json:"throttled"`
	// StartedPerMinute is the attempts started in the last 60 seconds.
	StartedPerMinute int `json:"startedPerMinute"`
	// LatencyMillis is how long its oldest QUEUED job has waited (from its AgingFrom);
	// 0 when none waits.
	LatencyMillis int64 `json:"latencyMillis"`
}

// Message types of the queue API (native extensions).
const (
	TypeListQueues   Type = "LIST_QUEUES"
	TypeQueueList    Type = "QUEUE_LIST"
	TypePauseQueue   Type = "PAUSE_QUEUE"
	TypeResumeQueue  Type = "RESUME_QUEUE"
	TypeSetQueue     Type = "SET_QUEUE"
	TypeQueueUpdated Type = "QUEUE_UPDATED"
)

// ListQueues asks for every queue (jobbus.api.queue.list).
type ListQueues struct{}

// QueueList answers ListQueues, sorted by name.
type QueueList struct {
	Queues []QueueInfo `json:"queues"`
}

// PauseQueue pauses a known queue (jobbus.api.queue.pause): it accepts jobs and starts
// none, until resumed, across restarts and failovers.
type PauseQueue struct {
	Queue string `json:"queue"`
}

// ResumeQueue resumes a known queue (jobbus.api.queue.resume).
type ResumeQueue struct {
	Queue string `json:"queue"`
}

// SetQueue changes a queue's limits (jobbus.api.queue.set), creating the queue if
// need be; an absent field keeps its value.
type SetQueue struct {
	Queue          string `json:"queue"`
	MaxRunning     *int   `json:"maxRunning,omitempty"`
	KeyConcurrency *int   `json:"keyConcurrency,omitempty"`
}

// QueueUpdated answers PauseQueue, ResumeQueue and SetQueue once the settings are durable.
type QueueUpdated struct {
	Queue QueueInfo `json:"queue"`
}

func (ListQueues) MessageType() Type   { return TypeListQueues }
func (QueueList) MessageType() Type    { return TypeQueueList }
func (PauseQueue) MessageType() Type   { return TypePauseQueue }
func (ResumeQueue) MessageType() Type  { return TypeResumeQueue }
func (SetQueue) MessageType() Type     { return TypeSetQueue }
func (QueueUpdated) MessageType() Type { return TypeQueueUpdated }

func (m ListQueues) MarshalJSON() ([]byte, error) { return encode(m.MessageType(), struct{}{}) }

func (m QueueList) MarshalJSON() ([]byte, error) {
	type plain QueueList
	if m.Queues == nil {
		m.Queues = []QueueInfo{}
	}
	return encode(m.MessageType(), plain(m))
}

func (m PauseQueue) MarshalJSON() ([]byte, error) {
	type plain PauseQueue
	return encode(m.MessageType(), plain(m))
}

func (m ResumeQueue) MarshalJSON() ([]byte, error) {
	type plain ResumeQueue
	return encode(m.MessageType(), plain(m))
}

func (m SetQueue) MarshalJSON() ([]byte, error) {
	type plain SetQueue
	return encode(m.MessageType(), plain(m))
}

func (m QueueUpdated) MarshalJSON() ([]byte, error) {
	type plain QueueUpdated
	return encode(m.MessageType(), plain(m))
}

// UnknownQueue is the ERROR text for a queue the coordinator does not know.
func UnknownQueue(name string) *Error {
	return &Error{Message: fmt.Sprintf("%s'%s' (a queue exists once a job, a worker or `queue set` used it)", unknownQueuePrefix, name)}
}

const unknownQueuePrefix = "Unknown queue: "

// IsUnknownQueue reports whether an ERROR text is UnknownQueue's.
func IsUnknownQueue(msg string) bool { return strings.HasPrefix(msg, unknownQueuePrefix) }

// CheckJSONPointer reports whether p is a JSON Pointer (RFC 6901) naming a member
// inside a payload: "/" then tokens separated by "/", "~" only as "~0" or "~1".
func CheckJSONPointer(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("JSON Pointer %q must start with '/'", p)
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '~' && (i+1 == len(p) || p[i+1] != '0' && p[i+1] != '1') {
			return fmt.Errorf("JSON Pointer %q: '~' must be followed by 0 or 1", p)
		}
	}
	return nil
}

// ErrKeyNotResolved is returned (wrapped) by ConcurrencyKeyAt when the pointer names
// nothing usable in the payload.
var ErrKeyNotResolved = errors.New("concurrency key pointer does not resolve")

// ConcurrencyKeyAt returns the concurrency key the JSON Pointer p names in payload: a
// string as it is, a number as written. Anything else (absent, null, an object, an
// array, a boolean, an empty string) is an error wrapping ErrKeyNotResolved.
func ConcurrencyKeyAt(payload json.RawMessage, p string) (string, error) {
	if err := CheckJSONPointer(p); err != nil {
		return "", err
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return "", fmt.Errorf("%w: %s: payload is not JSON", ErrKeyNotResolved, p)
	}
	for tok := range strings.SplitSeq(p[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := v.(type) {
		case map[string]any:
			next, ok := c[tok]
			if !ok {
				return "", fmt.Errorf("%w: %s: no member %q", ErrKeyNotResolved, p, tok)
			}
			v = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) || (len(tok) > 1 && tok[0] == '0') {
				return "", fmt.Errorf("%w: %s: no element %q", ErrKeyNotResolved, p, tok)
			}
			v = c[i]
		default:
			return "", fmt.Errorf("%w: %s: %q is inside a %s", ErrKeyNotResolved, p, tok, kindOf(v))
		}
	}
	var key string
	switch c := v.(type) {
	case string:
		key = c
	case json.Number:
		key = c.String()
	default:
		return "", fmt.Errorf("%w: %s names a %s, not a string or number", ErrKeyNotResolved, p, kindOf(v))
	}
	if err := CheckConcurrencyKey(key); err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrKeyNotResolved, p, err)
	}
	return key, nil
}

func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case bool:
		return "boolean"
	case string:
		return "string"
	case json.Number:
		return "number"
	}
	return fmt.Sprintf("%T", v)
}

// extendedBeyondQueue reports whether s uses an extension field besides its queue and
// concurrency key, which the fast encoder writes (hotcodec.go).
func (s *SubmitJob) extendedBeyondQueue() bool {
	c := *s
	c.Queue, c.ConcurrencyKey = "", ""
	return c.extended()
}
