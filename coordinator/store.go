package coordinator

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// ErrFenced means a write found the record changed by someone else: another coordinator
// writes this state, so this one must stop (DESIGN invariant 3).
var ErrFenced = errors.New("coordinator fenced: job state was written by another coordinator")

// binding is an idempotency key's value in protocol.KeysBucket.
type binding struct {
	JobID       string `json:"jobId"`
	Fingerprint string `json:"fingerprint"`
}

// keyName encodes an idempotency key (any non-empty string) as a valid KV key.
func keyName(key string) string {
	return "k." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

func openBuckets(ctx context.Context, js jetstream.JetStream, replicas int) (jobs, keys jetstream.KeyValue, err error) {
	cfg := func(name, desc string) jetstream.KeyValueConfig {
		return jetstream.KeyValueConfig{Bucket: name, Description: desc, History: 1, Storage: jetstream.FileStorage, Replicas: replicas}
	}
	jobs, err = js.CreateOrUpdateKeyValue(ctx, cfg(protocol.JobsBucket, "jobbus job records"))
	if err != nil {
		return nil, nil, fmt.Errorf("open bucket %s: %w", protocol.JobsBucket, err)
	}
	keys, err = js.CreateOrUpdateKeyValue(ctx, cfg(protocol.KeysBucket, "jobbus idempotency keys"))
	if err != nil {
		return nil, nil, fmt.Errorf("open bucket %s: %w", protocol.KeysBucket, err)
	}
	return jobs, keys, nil
}

// markDirty records a change to j and queues it for a writer; fn, if not nil, runs once
// the change is durable. Called with c.mu held.
func (c *Coordinator) markDirty(j *job, fn func(error)) {
	j.version++
	j.rec.UpdatedAt = c.now().UnixMilli()
	c.noteChange(j)
	if fn != nil {
		j.waiters = append(j.waiters, waiter{version: j.version, fn: fn})
	}
	if !j.writing {
		c.queueWrite(j)
	}
}

// queueWrite hands j to the writers. Called with c.mu held.
func (c *Coordinator) queueWrite(j *job) {
	j.writing = true
	c.writes++
	c.dirty = append(c.dirty, j)
	c.wakeWriter()
}

// doneWriting releases j from the writers. Called with c.mu held.
func (c *Coordinator) doneWriting(j *job) {
	j.writing = false
	c.writes--
}

func (c *Coordinator) wakeWriter() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// writer persists dirty jobs until ctx ends. Changes made while a write is in flight are
// coalesced into the next write of the same job, so a job has at most one write in flight
// and each write is a CAS on the revision the previous one returned.
func (c *Coordinator) writer(ctx context.Context) {
	for {
		c.mu.Lock()
		var j *job
		if len(c.dirty) > 0 {
			j = c.dirty[0]
			c.dirty[0] = nil
			c.dirty = c.dirty[1:]
			if len(c.dirty) > 0 {
				c.wakeWriter()
			}
		}
		c.unlock()
		if j == nil {
			select {
			case <-ctx.Done():
				return
			case <-c.wake:
				continue
			}
		}
		c.persist(ctx, j)
	}
}

// persist writes j's current record, retrying transient failures until ctx ends.
func (c *Coordinator) persist(ctx context.Context, j *job) {
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		data, err := json.Marshal(&j.rec)
		rev, version, key := j.rev, j.version, j.rec.IdempotencyKey
		bind := binding{JobID: j.rec.JobID, Fingerprint: j.rec.Fingerprint}
		c.unlock()
		if err != nil {
			c.fail(j, fmt.Errorf("encode job %s: %w", j.rec.JobID, err))
			return
		}
		start := time.Now()
		newRev, err := c.write(ctx, j.rec.JobID, rev, data, key, bind)
		c.noteStored(j, start, err)
		if err == nil {
			c.written(j, newRev, version)
			return
		}
		if permanent(err) {
			c.log.Error("job write impossible; giving up on it", "job", j.rec.JobID, "err", err)
			c.fail(j, err)
			c.dropUnstored(j)
			return
		}
		if errors.Is(err, ErrFenced) || ctx.Err() != nil {
			c.fail(j, err)
			if errors.Is(err, ErrFenced) {
				c.fence(err)
			}
			return
		}
		c.log.Warn("job write failed; retrying", "job", j.rec.JobID, "err", err, "attempt", attempt)
		select {
		case <-ctx.Done():
			c.fail(j, ctx.Err())
			return
		case <-time.After(min(time.Duration(attempt+1)*50*time.Millisecond, time.Second)):
		}
	}
}

// write stores one record: Create for a new job (after binding its idempotency key), a
// CAS Update otherwise.
func (c *Coordinator) write(ctx context.Context, id string, rev uint64, data []byte, key string, bind binding) (uint64, error) {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if rev == 0 {
		if key != "" {
			if err := c.bind(wctx, key, bind); err != nil {
				return 0, err
			}
		}
		r, err := c.jobsKV.Create(wctx, id, data)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, fmt.Errorf("%w (job %s exists)", ErrFenced, id)
		}
		return r, err
	}
	r, err := c.jobsKV.Update(wctx, id, data, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("%w (job %s moved past revision %d)", ErrFenced, id, rev)
	}
	return r, err
}

// bind creates an idempotency binding; an identical one left by an interrupted earlier
// write is fine, any other is another coordinator's.
func (c *Coordinator) bind(ctx context.Context, key string, b binding) error {
	data, _ := json.Marshal(b)
	_, err := c.keysKV.Create(ctx, keyName(key), data)
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return err
	}
	entry, gerr := c.keysKV.Get(ctx, keyName(key))
	if gerr != nil {
		return gerr
	}
	var old binding
	if json.Unmarshal(entry.Value(), &old) == nil && old.JobID == b.JobID {
		return nil
	}
	return fmt.Errorf("%w (idempotency key bound to job %s)", ErrFenced, old.JobID)
}

// permanent reports a write error that retrying cannot cure. The submission bounds
// (payload and key sizes, result truncation) keep it from happening.
func permanent(err error) bool {
	return errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, jetstream.ErrInvalidKey)
}

// written records a durable write and runs the waiters it satisfied.
func (c *Coordinator) written(j *job, rev, version uint64) {
	c.mu.Lock()
	j.rev = rev
	c.noteWritten(j, version)
	done := takeWaiters(j, version)
	c.doneWriting(j)
	if j.version > version { // changed while being written
		c.queueWrite(j)
	}
	c.unlock()
	for _, w := range done {
		w.fn(nil)
	}
}

// fail ends every waiter of j with err.
func (c *Coordinator) fail(j *job, err error) {
	c.mu.Lock()
	done := j.waiters
	j.waiters = nil
	c.doneWriting(j)
	c.unlock()
	for _, w := range done {
		w.fn(err)
	}
}

// dropUnstored removes a job that was never stored, as if it had not been submitted:
// its submitter got an error, not an id.
func (c *Coordinator) dropUnstored(j *job) {
	c.mu.Lock()
	defer c.unlock()
	if j.rev != 0 || c.jobs[j.rec.JobID] != j {
		return
	}
	delete(c.jobs, j.rec.JobID)
	if k := j.rec.IdempotencyKey; k != "" && c.keys[k] == j {
		delete(c.keys, k)
	}
	c.order = slices.DeleteFunc(c.order, func(o *job) bool { return o == j })
	if j.rec.State.Active() {
		c.active--
	}
	c.ready.forget(j)
}

func takeWaiters(j *job, version uint64) []waiter {
	n := 0
	for n < len(j.waiters) && j.waiters[n].version <= version {
		n++
	}
	done := j.waiters[:n:n]
	j.waiters = j.waiters[n:]
	return done
}
