package coordinator

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/backoff"
)

// ErrFenced means a write found the state changed by someone else: another coordinator
// leads, or a write whose outcome was unknown landed after all. This coordinator must
// stop and a fresh one recover from KV (DESIGN invariant 3).
var ErrFenced = errors.New("coordinator fenced: job state was written by another coordinator")

// binding is an idempotency key's value in protocol.JobsBucket, under bindingKey(key).
type binding struct {
	JobID       string `json:"jobId"`
	Fingerprint string `json:"fingerprint"`
}

// bindingKey encodes an idempotency key (any non-empty string) as a valid KV key.
func bindingKey(key string) string {
	return protocol.KeyPrefix + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// markerTTL is how long the marker JetStream leaves when a finished record expires
// stays: a live watcher (jobbus watch, the dashboard) sees it at once, and each marker
// costs the server memory, so it goes soon (with 1 minute, serve under full load with
// --retention 30s held about 60% more memory).
const markerTTL = 5 * time.Second

// openBuckets opens the jobs bucket, whose stream takes atomic batches (group commit,
// batch.go), and returns its stream too, which recovery and checkpoints read. OpenBucket (buckets.go) waits for the cluster and checks the replica count;
// c.Replicas becomes the bucket's (0 picks one: buckets.go).
func openBuckets(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, c *Config) (jetstream.KeyValue, jetstream.Stream, error) {
	// LimitMarkerTTL turns on per-message TTLs, which retention uses.
	jobs, err := OpenBucket(ctx, nc, js, *c, jetstream.KeyValueConfig{
		Bucket: protocol.JobsBucket, Description: "jobbus job records, idempotency keys and leadership term",
		History: 1, Storage: jetstream.FileStorage, LimitMarkerTTL: markerTTL})
	if err != nil {
		return nil, nil, err
	}
	stream, err := js.Stream(ctx, jobsStream)
	if err != nil {
		return nil, nil, fmt.Errorf("open bucket %s: %w", protocol.JobsBucket, err)
	}
	c.Replicas = stream.CachedInfo().Config.Replicas
	if cfg := stream.CachedInfo().Config; !cfg.AllowAtomicPublish {
		cfg.AllowAtomicPublish = true
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return nil, nil, fmt.Errorf("bucket %s: allow atomic batches: %w", protocol.JobsBucket, err)
		}
	}
	return jobs, stream, nil
}

const (
	jobsStream    = "KV_" + protocol.JobsBucket
	jobsSubjects  = "$KV." + protocol.JobsBucket + "."
	termSubject   = jobsSubjects + protocol.TermKey
	recordsFilter = jobsSubjects + "*"
)

// markDirty records a change to j and queues it for a committer; fn, if not nil, runs
// once the change is durable. Called with c.mu held.
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

// queueWrite hands j to the committers. Called with c.mu held.
func (c *Coordinator) queueWrite(j *job) {
	j.writing = true
	c.writes++
	c.dirty = append(c.dirty, j)
	c.wakeWriter()
}

// doneWriting releases j from the committers. Called with c.mu held.
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

// maxBatchJobs bounds the jobs one batch carries (each takes one or two messages of
// JetStream's 1,000 per atomic batch).
const maxBatchJobs = 256

// batching reports whether writes go as atomic batches (group commit): where each
// write costs a replication round or an fsync, so that one covers many. A single
// server's atomic batch stages on disk, which costs more than it saves unless every
// write is synced. Batches go one at a time: then each carries everything that waited
// for the one before, and in a cluster JetStream refuses a batch that checks the term
// while another's check is being replicated. On a single server syncing every write,
// one batch in flight made 1,880 jobs/s where 4 made 670 and 32 made 260 (bench --jobs
// 2000 --submitters 16 --workers 1 --worker-capacity 64 --sync always).
func (c *Coordinator) batching() bool {
	return c.cfg.Replicas > 1 || c.cfg.SyncAlways
}

// committer persists dirty jobs until ctx ends. When batching, as many as are waiting
// go in one atomic batch: group commit, so that under load one round trip (and with
// SyncAlways one fsync) covers many transitions. Otherwise each goes on its own
// through p, which does not wait for one before sending the next. Changes made while a
// job is in flight are coalesced into its next write, so a job has at most one write
// in flight and each is a CAS on the revision the previous one returned.
func (c *Coordinator) committer(ctx context.Context, p *pipeline) {
	for {
		c.mu.Lock()
		ws, err := c.takeDirty(maxBatchJobs)
		c.unlock()
		for _, e := range err {
			c.fail(e.j, e.err)
		}
		if len(ws) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-c.wake:
				continue
			}
		}
		if p == nil {
			c.commit(ctx, ws)
			continue
		}
		for i, w := range ws {
			if !p.send(w) {
				for _, w := range ws[i+1:] {
					c.fail(w.j, ctx.Err())
				}
				return
			}
		}
	}
}

type encodeError struct {
	j   *job
	err error
}

// takeDirty encodes up to n dirty jobs. Called with c.mu held.
func (c *Coordinator) takeDirty(n int) ([]pendingWrite, []encodeError) {
	n = min(n, len(c.dirty))
	if n == 0 {
		return nil, nil
	}
	ws := make([]pendingWrite, 0, n)
	var bad []encodeError
	for _, j := range c.dirty[:n] {
		w, err := c.pendingWrite(j)
		if err != nil {
			bad = append(bad, encodeError{j, fmt.Errorf("encode job %s: %w", j.rec.JobID, err)})
			continue
		}
		ws = append(ws, w)
	}
	clear(c.dirty[:n])
	c.dirty = c.dirty[n:]
	if len(c.dirty) > 0 {
		c.wakeWriter()
	}
	return ws, bad
}

// commit makes ws durable as one batch, retrying transient failures until ctx ends.
func (c *Coordinator) commit(ctx context.Context, ws []pendingWrite) {
	for attempt := 0; ; attempt++ {
		start := time.Now()
		revs, err := c.publish(ctx, ws)
		for _, w := range ws {
			c.noteStored(w.j, start, err)
		}
		switch {
		case err == nil:
			for i, w := range ws {
				c.stored(w.j, revs[i], w.version)
			}
			return
		case permanent(err) && len(ws) > 1:
			// Find the one that cannot be written; the others can.
			for _, w := range ws {
				c.commit(ctx, []pendingWrite{w})
			}
			return
		case permanent(err):
			c.log.Error("job write impossible; giving up on it", "job", ws[0].id, "err", err)
			c.giveUp(ws[0].j, err)
			return
		case errors.Is(err, ErrFenced) || ctx.Err() != nil:
			for _, w := range ws {
				c.fail(w.j, err)
			}
			if errors.Is(err, ErrFenced) {
				c.fence(err)
			}
			return
		}
		if ferr := c.storeFailure(ctx, err); ferr != nil {
			// A job not yet stored is given up, so its submitter hears "store full"
			// now rather than JOB_SUBMITTED much later, or never; accepted jobs wait
			// for room (storage.go).
			if ws = c.dropCreates(ws, ferr); len(ws) == 0 {
				return
			}
		}
		c.log.Warn("job write failed; retrying", "jobs", len(ws), "err", err, "attempt", attempt)
		select {
		case <-ctx.Done():
			for _, w := range ws {
				c.fail(w.j, ctx.Err())
			}
			return
		case <-time.After(backoff.Policy{Base: 50 * time.Millisecond, Max: time.Second}.Delay(attempt)):
		}
	}
}

// dropCreates gives up the creates among ws with err and returns the other writes.
func (c *Coordinator) dropCreates(ws []pendingWrite, err error) []pendingWrite {
	var kept []pendingWrite
	for _, w := range ws {
		if w.rev != 0 {
			kept = append(kept, w)
			continue
		}
		c.giveUp(w.j, err)
	}
	return kept
}

// pendingWrite is one write of a job's record, taken under c.mu.
type pendingWrite struct {
	j       *job
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
	data, err := j.rec.AppendJSON(nil)
	return pendingWrite{
		j: j, id: j.rec.JobID, key: j.rec.IdempotencyKey, data: data,
		rev: j.rev, version: j.version, seq: j.rec.Seq, state: j.rec.State,
		ttl:     c.ttl(j.rec.EndedAt),
		expires: time.UnixMilli(j.rec.EndedAt).Add(c.cfg.Retention).UnixMilli(),
		bind:    binding{JobID: j.rec.JobID, Fingerprint: j.rec.Fingerprint},
	}, err
}

// publish writes ws, one atomic batch when batching.
func (c *Coordinator) publish(ctx context.Context, ws []pendingWrite) ([]uint64, error) {
	if len(ws) > 1 || c.batching() {
		return c.publishBatch(ctx, ws)
	}
	rev, err := c.publishOne(ctx, &ws[0])
	return []uint64{rev}, err
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

// wrongLastSequence reports a publish refused because the subject's last message was
// not the one expected: someone else wrote the record.
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
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
	c.countWrite()
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

// giveUp ends j's waiters with err and, if j was never stored, removes it as if it had
// not been submitted.
func (c *Coordinator) giveUp(j *job, err error) {
	c.fail(j, err)
	c.dropUnstored(j)
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
	if j.rec.State == protocol.StateRunning { // assigned at once; its assignment never went
		if w := c.workers[j.rec.WorkerID]; w != nil && w.running[j.rec.JobID].attempt == j.rec.AttemptID {
			delete(w.running, j.rec.JobID)
		}
		c.deadlines.remove(j)
		c.leaseEnded(j)
		c.schedule()
	}
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
