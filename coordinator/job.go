package coordinator

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// job is a record in memory plus what the coordinator needs to schedule and persist it.
// Every field is guarded by scheduler.mu.
type job struct {
	rec        protocol.Record
	deadline   time.Time     // of the current attempt, while RUNNING
	deadlineAt int           // 1 + its index in scheduler.deadlines; 0 when not in it
	timeout    time.Duration // the current attempt's execution timeout (routing.go)
	leased     bool          // its attempt counts against its type's concurrency (routing.go)

	rev     uint64 // KV revision of the last durable write; 0 until created
	version uint64 // bumped by every change
	stored  uint64 // the version the last durable write stored
	writing bool   // queued for or held by a writer
	// uncertain: a write of it was sent whose outcome is unknown, and none of its
	// copies is known stored or known refused for good since (outcome.go).
	uncertain bool
	// answer is its submission's reply while it is not sent, so that a store fault
	// can hurry it (outcome.go).
	answer  *reply
	waiters []waiter
	// waitBuf backs waiters while they are few (wait): a job has one or two at a
	// time (its submitter's, its assignment's, its result's), and a slice of their
	// own cost an allocation or two per write.
	waitBuf  [2]waiter
	queueGen uint64 // invalidates stale entries in the ready queue
	inQueue  bool
	lane     *keyLane // while inQueue: where it waits (queue.go)

	seen     protocol.State // the state last reported to the Observer
	writes   int            // durable writes, for the Observer
	finished bool           // the terminal write was reported
	took     time.Duration  // the last write's latency; only its writer touches it

	vis         visFields // its trace context and progress (visfields.go)
	progressAt  time.Time // its progress's last write (progress.go)
	progressDue bool      // a write of its progress is armed
}

// waiter runs once the job's record at version (or later) is durable, or with the error
// that stopped it from becoming so. A locked one runs with the scheduler's mu held (an
// assignment's: those released by one burst of writes leave together); the others
// run without it.
type waiter struct {
	version uint64
	fn      func(error)
	locked  bool
}

func (j *job) snapshot() protocol.Job { return j.rec.Snapshot() }

// effectivePriority is the base level raised one level per whole aging step waited since
// from (Record.AgingFrom: submission, or a delayed job's run time), capped at HIGH.
func effectivePriority(base protocol.Priority, from int64, now time.Time, step time.Duration) int {
	level := base.Level()
	// In durations, not milliseconds: a step under a millisecond is valid too.
	waited := time.Duration(now.UnixMilli()-from) * time.Millisecond
	if waited > 0 && step > 0 {
		steps := waited / step
		if steps >= 2 {
			return protocol.PriorityHigh.Level()
		}
		level += int(steps)
	}
	return min(level, protocol.PriorityHigh.Level())
}

// fingerprint identifies a submission for idempotency: task type, structurally equal
// payload, effective max attempts and priority.
func fingerprint(taskType string, payload json.RawMessage, maxAttempts int, p protocol.Priority) (string, error) {
	canon, err := canonicalJSON(payload)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00%s", taskType, canon, maxAttempts, p)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// canonicalJSON re-encodes v with sorted keys and no insignificant space, keeping
// numbers as written, so key order and spacing do not change a fingerprint.
func canonicalJSON(raw json.RawMessage) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical payload: %w", err)
	}
	return json.Marshal(v)
}

// newID returns a random UUID (version 4) in its canonical form (uuid, retained.go),
// valid as a KV key and a subject token.
func newID() string {
	var u uuid
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u.String()
}

func ptr(s string) *string { return &s }
