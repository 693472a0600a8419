package coordinator

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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

// markerTTL is how long the marker JetStream leaves when a finished record expires
// stays: a live watcher (jobbus watch, the dashboard) sees it at once, and each marker
// costs the server memory, so it goes soon (with 1 minute, serve under full load with
// --retention 30s held about 60% more memory).
const markerTTL = 5 * time.Second

func openBuckets(ctx context.Context, js jetstream.JetStream, replicas int) (jobs, keys jetstream.KeyValue, err error) {
	cfg := func(name, desc string) jetstream.KeyValueConfig {
		// LimitMarkerTTL turns on per-message TTLs, which retention uses.
		return jetstream.KeyValueConfig{Bucket: name, Description: desc, History: 1, Storage: jetstream.FileStorage,
			Replicas: replicas, LimitMarkerTTL: markerTTL}
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
	if j.rec.State.Terminal() && j.rec.EndedAt == 0 {
		j.rec.EndedAt = j.rec.UpdatedAt
	}
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
		w, err := c.pendingWrite(j)
		c.unlock()
		if err != nil {
			c.fail(j, fmt.Errorf("encode job %s: %w", w.id, err))
			return
		}
		start := time.Now()
		newRev, err := c.write(ctx, w)
		c.noteStored(j, start, err)
		if err == nil {
			c.written(j, newRev, w.version)
			if w.ttl > 0 && w.key != "" {
				c.expireBinding(ctx, w)
			}
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

// pendingWrite is one write of a job's record, taken under c.mu.
type pendingWrite struct {
	id, key string
	data    []byte
	rev     uint64 // the revision written over; 0 creates
	version uint64
	seq     uint64
	state   protocol.State
	ttl     time.Duration // how long a finished record is kept; 0 for ever
	expires int64         // when the job's retention ends, Unix milliseconds; with ttl
	bind    binding
}

// pendingWrite encodes j's record. Called with c.mu held.
func (c *Coordinator) pendingWrite(j *job) (pendingWrite, error) {
	data, err := json.Marshal(&j.rec)
	return pendingWrite{
		id: j.rec.JobID, key: j.rec.IdempotencyKey, data: data,
		rev: j.rev, version: j.version, seq: j.rec.Seq, state: j.rec.State,
		ttl:     c.ttl(j.rec.EndedAt),
		expires: time.UnixMilli(j.rec.EndedAt).Add(c.cfg.Retention).UnixMilli(),
		bind:    binding{JobID: j.rec.JobID, Fingerprint: j.rec.Fingerprint},
	}, err
}

// ttlMargin is how much longer JetStream keeps a finished record than this coordinator
// keeps the job, which it forgets on its own clock (expire), so that status, lists and
// the key agree: TTLs are whole seconds, and JetStream's expiry wheel may fire up to a
// tick early.
const ttlMargin = 2 * time.Second

// ttl is what is left of the retention of a job that ended at endedAt (milliseconds;
// 0 while active), at least JetStream's smallest TTL; 0 keeps the job for ever.
func (c *Coordinator) ttl(endedAt int64) time.Duration {
	if endedAt == 0 || c.cfg.Retention == 0 {
		return 0
	}
	left := c.cfg.Retention - c.now().Sub(time.UnixMilli(endedAt))
	return max((left+time.Second-1).Truncate(time.Second), time.Second) + ttlMargin
}

// write stores one record, a CAS on the revision it was read at (a new job's create
// expects none): a new job's idempotency key is bound first. The record carries its
// sequence and state in headers, and a finished one the TTL of its retention.
func (c *Coordinator) write(ctx context.Context, w pendingWrite) (uint64, error) {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if w.rev == 0 && w.key != "" {
		if err := c.bind(wctx, w.key, w.bind); err != nil {
			return 0, err
		}
	}
	msg := nats.NewMsg("$KV." + protocol.JobsBucket + "." + w.id)
	msg.Data = w.data
	msg.Header.Set(protocol.HeaderSeq, strconv.FormatUint(w.seq, 10))
	msg.Header.Set(protocol.HeaderState, string(w.state))
	opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(w.rev)}
	if w.ttl > 0 {
		opts = append(opts, jetstream.WithMsgTTL(w.ttl))
		msg.Header.Set(protocol.HeaderExpires, strconv.FormatInt(w.expires, 10))
	}
	ack, err := c.js.PublishMsg(wctx, msg, opts...)
	switch {
	case wrongLastSequence(err) && w.rev == 0:
		return 0, fmt.Errorf("%w (job %s exists)", ErrFenced, w.id)
	case wrongLastSequence(err):
		return 0, fmt.Errorf("%w (job %s moved past revision %d)", ErrFenced, w.id, w.rev)
	case err != nil:
		return 0, err
	}
	return ack.Sequence, nil
}

// wrongLastSequence reports a publish refused because the subject's last message was
// not the one expected: someone else wrote the record.
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// expireBinding gives a finished job's idempotency binding the TTL of the job's
// record, so the key can be used again once the job is gone. Should it fail, the key
// stays bound in KV; bind then finds it stale and takes it over.
func (c *Coordinator) expireBinding(ctx context.Context, w pendingWrite) {
	data, _ := json.Marshal(w.bind)
	msg := nats.NewMsg("$KV." + protocol.KeysBucket + "." + keyName(w.key))
	msg.Data = data
	for attempt := range 3 {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.js.PublishMsg(wctx, msg, jetstream.WithMsgTTL(w.ttl))
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		c.log.Warn("idempotency binding not given its TTL; retrying", "job", w.id, "err", err, "attempt", attempt)
	}
}

// bind creates an idempotency binding; an identical one left by an interrupted earlier
// write is fine, and so is a stale one, whose job this coordinator no longer keeps (it
// expired): it is taken over. Any other is another coordinator's.
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
	if !c.keeps(key, old.JobID) {
		_, err := c.keysKV.Update(ctx, keyName(key), data, entry.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("%w (idempotency key rebound meanwhile)", ErrFenced)
		}
		return err
	}
	return fmt.Errorf("%w (idempotency key bound to job %s)", ErrFenced, old.JobID)
}

// keeps reports whether key is bound, in this coordinator's memory, to job id.
func (c *Coordinator) keeps(key, id string) bool {
	c.mu.Lock()
	defer c.unlock()
	j := c.keys[key]
	return id != "" && (j != nil && j.rec.JobID == id || c.doneKeys[key].jobID == id)
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
	} else if j.rec.State.Terminal() && c.jobs[j.rec.JobID] == j {
		c.retire(j)
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
	c.index.remove(j.rec.Seq)
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
