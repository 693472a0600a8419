package coordinator

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// recover rebuilds memory from KV before anything is served, reading only what it
// needs to serve: every record's headers (its sequence and state), the whole record of
// active jobs only, and the idempotency bindings. A RUNNING job's attempt waits for its
// worker to claim it (unclaimed, below); one nobody claims is lost: it counts, and the
// job runs again or, if that was its last attempt, fails.
func (c *Coordinator) recover(ctx context.Context) error {
	heads, lastSeq, binds, fromCheckpoint, err := c.loadIndex(ctx)
	if err != nil {
		return fmt.Errorf("load %s: %w", protocol.JobsBucket, err)
	}
	var whole []string // active jobs, and records older than the headers
	for _, h := range heads {
		if h.state == "" || h.state.Active() {
			whole = append(whole, h.id)
		}
	}
	recs, err := c.loadRecords(ctx, whole)
	if err != nil {
		return fmt.Errorf("load %s: %w", protocol.JobsBucket, err)
	}
	// id -> sequence of every finished job, for bindings read apart from the jobs;
	// built only if some are (a million entries take a while).
	finished := sync.OnceValue(func() map[string]uint64 {
		m := make(map[string]uint64)
		for _, h := range heads {
			if h.state != "" && h.state.Terminal() {
				m[h.id] = h.seq
			}
		}
		for _, r := range recs {
			if r.State.Terminal() && r.EndedAt != 0 { // finished since its headers were read
				m[r.JobID] = r.Seq
			}
		}
		return m
	})
	c.mu.Lock()
	c.index.entries = slices.Grow(c.index.entries, len(heads))
	for _, h := range heads {
		if h.state != "" && h.state.Terminal() {
			c.restoreFinished(h)
		}
	}
	for _, r := range recs {
		c.restore(r.Record, r.rev)
	}
	c.index.sort()
	slices.SortFunc(c.expiring, func(a, b expiring) int { return cmp.Compare(a.at, b.at) })
	// Every job took at least one message of the stream, so its last sequence bounds
	// every job sequence ever given, those of expired jobs included. The last message
	// is this coordinator's term: a new store's first job is 1.
	c.seq = max(c.seq, lastSeq-1)
	if fromCheckpoint { // bindings written since the checkpoint
		for _, b := range binds {
			c.keepBinding(b.key, b.value, finished())
		}
	}
	c.unlock()
	if err := c.moveOldBindings(ctx, finished); err != nil {
		return err
	}
	if !fromCheckpoint {
		if err := c.repairBindings(ctx, finished); err != nil {
			return err
		}
	}
	// Reading a large store allocates far more than memory then keeps: give it back now
	// rather than at the runtime's leisure.
	if len(heads) > 10_000 {
		heads, recs = nil, nil
		debug.FreeOSMemory()
	}
	c.startClaims()
	return nil
}

// errStaleCheckpoint: so much was written after the checkpoint that reading every
// record's headers is quicker than replaying.
var errStaleCheckpoint = errors.New("checkpoint too old to replay")

// storedBinding is an idempotency binding read from the stream: its KV key and value.
type storedBinding struct {
	key   string
	value []byte
}

// loadIndex reads the heads of every job: from the checkpoint of the last term and what
// was written after it, when there is one, else from every record's headers.
func (c *Coordinator) loadIndex(ctx context.Context) (heads []head, lastSeq uint64, binds []storedBinding, fromCheckpoint bool, err error) {
	if at, ckpt, ok := c.loadCheckpoint(ctx, c.prevTerm); ok {
		heads, lastSeq, binds, err = c.replay(ctx, at, ckpt)
		if err == nil {
			c.log.Info("recovering from a checkpoint", "jobs", len(ckpt), "at", at, "stream_last", lastSeq)
			return heads, lastSeq, binds, true, nil
		}
		level := slog.LevelWarn
		if errors.Is(err, errStaleCheckpoint) {
			level = slog.LevelInfo
		}
		c.log.Log(ctx, level, "checkpoint not replayed; reading every record's headers", "err", err)
	}
	heads, lastSeq, err = c.loadHeads(ctx)
	return heads, lastSeq, nil, false, err
}

// replay brings a checkpoint's heads up to date with the records and bindings written
// after sequence at.
func (c *Coordinator) replay(ctx context.Context, at uint64, heads []head) ([]head, uint64, []storedBinding, error) {
	info, err := c.stream.Info(ctx)
	if err != nil {
		return nil, 0, nil, err
	}
	last := info.State.LastSeq
	// Reading messages after a sequence costs the server more per message than the
	// last message of each subject: past a point, reading everything is quicker.
	if last-at > uint64(len(heads))/2+minCheckpointWrites/10 {
		return nil, 0, nil, fmt.Errorf("%d writes since the checkpoint of %d jobs: %w", last-at, len(heads), errStaleCheckpoint)
	}
	changed := make(map[string]*head) // nil: removed
	after := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: at + 1,
		HeadersOnly: true, FilterSubjects: []string{recordsFilter}}
	err = consume(ctx, c.stream, after, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) {
		id := strings.TrimPrefix(msg.Subject(), jobsSubjects)
		if h, ok := readHead(id, msg.Headers(), meta); ok {
			changed[id] = &h
		} else {
			changed[id] = nil
		}
	})
	if err != nil {
		return nil, 0, nil, err
	}
	bound := make(map[string][]byte) // nil: removed
	after.HeadersOnly, after.FilterSubjects = false, []string{jobsSubjects + protocol.KeyPrefix + ">"}
	err = consume(ctx, c.stream, after, func(msg jetstream.Msg, _ *jetstream.MsgMetadata) {
		key := strings.TrimPrefix(msg.Subject(), jobsSubjects)
		if removal(msg.Headers()) {
			bound[key] = nil
		} else {
			bound[key] = bytes.Clone(msg.Data())
		}
	})
	if err != nil {
		return nil, 0, nil, err
	}
	out := heads[:0]
	for _, h := range heads {
		ch, ok := changed[h.id]
		switch {
		case !ok:
			out = append(out, h)
		case ch != nil:
			out = append(out, *ch)
		}
		delete(changed, h.id)
	}
	for _, ch := range changed {
		if ch != nil {
			out = append(out, *ch)
		}
	}
	binds := make([]storedBinding, 0, len(bound))
	for k, v := range bound {
		if v != nil {
			binds = append(binds, storedBinding{k, v})
		}
	}
	return out, last, binds, nil
}

// head is what a record's headers tell: enough to list a finished job.
type head struct {
	id      string
	seq     uint64
	state   protocol.State // "" for a record written before the headers
	at      time.Time      // of the record's last write
	expires int64          // when the job's retention ends, Unix milliseconds; 0: never

	key, fingerprint string // a finished job's idempotency binding, from a checkpoint
}

// loadHeads reads the headers of every record in the jobs bucket (an ordered consumer
// that delivers headers only, the last message of each key), and the stream's last
// sequence.
func (c *Coordinator) loadHeads(ctx context.Context) ([]head, uint64, error) {
	info, err := c.stream.Info(ctx)
	if err != nil {
		return nil, 0, err
	}
	if info.State.Msgs == 0 {
		return nil, info.State.LastSeq, nil
	}
	var heads []head
	last := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		HeadersOnly: true, FilterSubjects: []string{recordsFilter}}
	err = consume(ctx, c.stream, last, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) {
		id := strings.TrimPrefix(msg.Subject(), jobsSubjects)
		if h, ok := readHead(strings.Clone(id), msg.Headers(), meta); ok {
			heads = append(heads, h)
		}
	})
	return heads, info.State.LastSeq, err
}

// removal reports a KV delete or purge, or an expiry marker.
func removal(h nats.Header) bool {
	return h.Get("KV-Operation") != "" || h.Get("Nats-Marker-Reason") != ""
}

// readHead reads a record's headers; false for a removal.
func readHead(id string, h nats.Header, meta *jetstream.MsgMetadata) (head, bool) {
	if removal(h) {
		return head{}, false
	}
	seq, _ := strconv.ParseUint(h.Get(protocol.HeaderSeq), 10, 64)
	st, _ := protocol.ParseState(h.Get(protocol.HeaderState)) // the constant, not a copy per job
	expires, _ := strconv.ParseInt(h.Get(protocol.HeaderExpires), 10, 64)
	return head{id: id, seq: seq, state: st, at: meta.Timestamp, expires: expires}, true
}

// consume hands fn the messages of an ordered consumer of stream with cfg, until none
// is pending, and deletes the consumer rather than leave it to time out.
func consume(ctx context.Context, stream jetstream.Stream, cfg jetstream.OrderedConsumerConfig, fn func(jetstream.Msg, *jetstream.MsgMetadata)) error {
	cons, err := stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if ci := cons.CachedInfo(); ci != nil {
			_ = stream.DeleteConsumer(context.WithoutCancel(ctx), ci.Name)
		}
	}()
	if ci, err := cons.Info(ctx); err != nil || ci.NumPending == 0 {
		return err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(4096))
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		fn(msg, meta)
		if meta.NumPending == 0 {
			return nil
		}
	}
}

// stored is a record read whole, with its revision.
type stored struct {
	protocol.Record
	rev uint64
}

// loadRecords reads the records of ids, a few at a time; one gone meanwhile (it
// expired) is left out.
func (c *Coordinator) loadRecords(ctx context.Context, ids []string) ([]stored, error) {
	var (
		mu    sync.Mutex
		out   []stored
		first error
		wg    sync.WaitGroup
		next  = make(chan string)
	)
	for range min(8, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range next {
				e, err := c.jobsKV.Get(ctx, id)
				var r protocol.Record
				if err == nil {
					err = json.Unmarshal(e.Value(), &r)
					if err != nil { // unreadable: skipped, as before
						c.log.Warn("skipping unreadable job record", "key", id, "err", err)
						continue
					}
				}
				mu.Lock()
				switch {
				case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
				case err != nil:
					first = cmp.Or(first, err)
				default:
					out = append(out, stored{Record: r, rev: e.Revision()})
				}
				mu.Unlock()
			}
		}()
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	return out, first
}

// restore adds one stored job to memory: a finished one only as its entry, unless its
// record predates retention and must be written again with a TTL. Called with c.mu held.
func (c *Coordinator) restore(r protocol.Record, rev uint64) {
	c.seq = max(c.seq, r.Seq)
	c.lastMilli = max(c.lastMilli, r.CreatedAt)
	if r.State.Terminal() && (r.EndedAt != 0 || c.cfg.Retention == 0) {
		c.restoreFinished(head{seq: r.Seq, id: r.JobID, state: r.State, at: time.UnixMilli(max(r.EndedAt, r.UpdatedAt))})
		return
	}
	j := &job{rec: r, rev: rev, seen: r.State}
	c.jobs[r.JobID] = j
	c.index.add(r.Seq, r.JobID, r.State, "", j)
	if r.IdempotencyKey != "" {
		c.keys[r.IdempotencyKey] = j
	}
	if r.State.Terminal() { // written before retention: again, with its TTL
		j.rec.EndedAt = r.UpdatedAt
		j.version++
		c.queueWrite(j)
		return
	}
	c.active++
	switch r.State {
	case protocol.StateQueued:
		c.ready.push(j)
	case protocol.StateRetryWait:
		c.pushRetry(j)
	case protocol.StateRunning:
		c.awaitClaim(j)
	}
}

// Attempts running when the coordinator restarted (or another took over). Their
// workers may well be alive and still running them: a restart of the coordinator, or a
// NATS blink, is no reason to abandon them. So recovery keeps each RUNNING job RUNNING
// under its attempt, unclaimed, and waits for its worker: a worker that registers (or
// heartbeats) reporting the attempt (protocol/held.go) claims it, and it goes on as if
// nothing happened; a result for it counts, whether it comes before the worker
// registers or after. No new attempt is started meanwhile, so a job never runs twice
// at once because the coordinator restarted. Only an attempt nobody claims within the
// claim grace (Config.ClaimGrace) is lost, as a worker's attempts are when the worker
// is: its job runs again, or fails on its final attempt. A registration of the
// attempt's worker that reports what it holds, without it, loses it at once (the
// worker restarted, or never received it). Guarded by Coordinator.mu.
type unclaimed struct {
	attempts map[string]string // job id -> attempt id
	until    time.Time         // when the unclaimed ones are lost
}

// errUnclaimedFinal is the error of a job whose final attempt was running when the
// coordinator restarted, and that nobody claimed.
const errUnclaimedFinal = "coordinator restarted during final attempt; outcome unknown"

// claimGrace is how long after recovery the workers have to claim their attempts: a
// heartbeat timeout, plus the time their connections take to come back
// (reconnectAllowance), unless configured.
func (c *Coordinator) claimGrace() time.Duration {
	if c.cfg.ClaimGrace > 0 {
		return c.cfg.ClaimGrace
	}
	return c.cfg.HeartbeatTimeout + reconnectAllowance
}

// awaitClaim keeps a job restored RUNNING under its attempt until a worker claims it.
// Its execution deadline still runs from the attempt's start, which was the record's
// last write. Called with c.mu held.
func (c *Coordinator) awaitClaim(j *job) {
	if j.rec.AttemptID == "" || j.rec.WorkerID == "" { // nothing to claim it by
		c.lostUnclaimed(j)
		return
	}
	if c.unclaimed.attempts == nil {
		c.unclaimed.attempts = make(map[string]string)
	}
	c.unclaimed.attempts[j.rec.JobID] = j.rec.AttemptID
	c.leaseStarted(j, time.UnixMilli(j.rec.UpdatedAt))
	heap.Push(&c.deadlines, j)
}

// startClaims starts the claim grace, once recovery is done and just before serving.
func (c *Coordinator) startClaims() {
	c.mu.Lock()
	defer c.unlock()
	if n := len(c.unclaimed.attempts); n > 0 {
		c.unclaimed.until = c.now().Add(c.claimGrace())
		c.log.Info("attempts running before the restart wait for their workers to claim them", "attempts", n, "grace", c.claimGrace())
	}
}

// extendClaims gives the unclaimed attempts until at least until: the workers'
// silence was the coordinator's (offline.go). Called with c.mu held.
func (c *Coordinator) extendClaims(until time.Time) {
	if len(c.unclaimed.attempts) > 0 && until.After(c.unclaimed.until) {
		c.unclaimed.until = until
	}
}

// claim lets w claim the attempt a it reports holding, if it is an unclaimed attempt
// that was w's: its lease becomes w's, numbered 0 as a lease kept across a
// registration (reconcile.go). It reports whether it did. Called with c.mu held.
func (c *Coordinator) claim(w *worker, a protocol.AttemptRef) bool {
	if a.AttemptID == "" || c.unclaimed.attempts[a.JobID] != a.AttemptID {
		return false
	}
	j := c.jobs[a.JobID]
	if j == nil || j.rec.State != protocol.StateRunning || j.rec.AttemptID != a.AttemptID {
		delete(c.unclaimed.attempts, a.JobID) // it ended meanwhile: a result, a cancel, its deadline
		return false
	}
	if j.rec.WorkerID != w.id {
		return false // another worker's: only its own worker claims it
	}
	delete(c.unclaimed.attempts, a.JobID)
	w.running[a.JobID] = assignment{attempt: a.AttemptID}
	c.log.Debug("running attempt claimed by its worker", "job", a.JobID, "attempt", a.AttemptID, "worker", w.id)
	return true
}

// claimReported lets w claim the unclaimed attempts its registration reports (h; nil
// from a worker that reports nothing), and loses at once the others that were w's:
// a worker's report lists every attempt it was assigned whose result is not yet
// acknowledged, so one missing from it is not running there. It returns how many
// were claimed. Called with c.mu held.
func (c *Coordinator) claimReported(w *worker, h *protocol.Held) (claimed int) {
	if h == nil || len(c.unclaimed.attempts) == 0 {
		return 0
	}
	for _, a := range h.Attempts {
		if c.claim(w, a.AttemptRef) {
			claimed++
		}
	}
	for jobID := range c.unclaimed.attempts {
		if j := c.jobs[jobID]; j != nil && j.rec.WorkerID == w.id {
			attempt := c.unclaimed.attempts[jobID]
			delete(c.unclaimed.attempts, jobID)
			c.loseUnclaimed(j, attempt)
		}
	}
	return claimed
}

// expireClaims loses the attempts nobody claimed within the grace. Called with c.mu
// held.
func (c *Coordinator) expireClaims(now time.Time) {
	if len(c.unclaimed.attempts) == 0 || now.Before(c.unclaimed.until) {
		return
	}
	for jobID, attempt := range c.unclaimed.attempts {
		if j := c.jobs[jobID]; j != nil {
			c.loseUnclaimed(j, attempt)
		}
	}
	c.log.Info("attempts running before the restart not claimed by any worker; counted as lost", "attempts", len(c.unclaimed.attempts))
	c.unclaimed.attempts = nil
	c.schedule()
}

// loseUnclaimed loses j's attempt, if it is still the unclaimed one. Called with c.mu
// held.
func (c *Coordinator) loseUnclaimed(j *job, attempt string) {
	if j.rec.State != protocol.StateRunning || j.rec.AttemptID != attempt {
		return // it ended meanwhile: a result, a cancel, its deadline
	}
	c.releaseLease(j)
	c.lostUnclaimed(j)
}

// lostUnclaimed settles a RUNNING job whose attempt is lost with the coordinator that
// ran it: the attempt counts, and the job runs again or, if that was its last attempt,
// fails. Called with c.mu held.
func (c *Coordinator) lostUnclaimed(j *job) {
	j.rec.WorkerID, j.rec.AttemptID = "", ""
	if j.rec.Attempts >= j.rec.MaxAttempts {
		j.rec.State = protocol.StateFailed
		j.rec.Error = ptr(errUnclaimedFinal)
		c.active--
	} else {
		j.rec.State = protocol.StateQueued
		c.ready.push(j)
	}
	c.markDirty(j, nil)
}

// restoreFinished adds a finished job, known by its entry only, whose record was last
// written at written. A record keeps the retention it was written with (expires, Unix
// milliseconds; 0 if it has none), as its TTL in JetStream does.
// Called with c.mu held.
func (c *Coordinator) restoreFinished(h head) {
	c.seq = max(c.seq, h.seq)
	expires := h.expires
	if expires == 0 && c.cfg.Retention > 0 {
		expires = h.at.Add(c.cfg.Retention).UnixMilli()
	}
	if expires > 0 && expires <= c.now().UnixMilli() {
		return // its retention ended: JetStream removes the record on its own
	}
	c.index.add(h.seq, h.id, h.state, h.key, nil)
	if h.key != "" {
		c.doneKeys[h.key] = doneKey{jobID: h.id, fingerprint: h.fingerprint}
	}
	if expires > 0 {
		c.expiring = append(c.expiring, expiring{at: expires, seq: h.seq})
	}
}

// repairBindings rebuilds the idempotency bindings of finished jobs (doneKeys) from
// the bindings stored beside the records, keeping the records as the truth: a binding
// whose job is gone or unknown is left alone, free to be written over.
func (c *Coordinator) repairBindings(ctx context.Context, finished func() map[string]uint64) error {
	last := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		FilterSubjects: []string{jobsSubjects + protocol.KeyPrefix + ">"}}
	err := consume(ctx, c.stream, last, func(msg jetstream.Msg, _ *jetstream.MsgMetadata) {
		if removal(msg.Headers()) {
			return
		}
		c.mu.Lock()
		c.keepBinding(strings.TrimPrefix(msg.Subject(), jobsSubjects), msg.Data(), finished())
		c.unlock()
	})
	if err != nil {
		return fmt.Errorf("load bindings: %w", err)
	}
	return nil
}

// keepBinding remembers the binding stored under k if its job is kept. Called with
// c.mu held.
func (c *Coordinator) keepBinding(k string, value []byte, finished map[string]uint64) bool {
	var b binding
	_ = json.Unmarshal(value, &b)
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(k, protocol.KeyPrefix))
	seq, ok := finished[b.JobID]
	if err != nil || !ok || c.jobs[b.JobID] != nil {
		return c.jobs[b.JobID] != nil // an active job's key comes with its record
	}
	e := c.index.find(seq)
	if e == nil || !c.index.hasID(e, b.JobID) {
		return false
	}
	c.index.setKey(e, string(raw))
	c.doneKeys[string(raw)] = doneKey{jobID: b.JobID, fingerprint: b.Fingerprint}
	return true
}

// moveOldBindings moves the bindings of kept jobs out of protocol.KeysBucket, where
// versions before the single jobs stream kept them, into the jobs bucket (fenced
// batches, as every write), then deletes that bucket.
func (c *Coordinator) moveOldBindings(ctx context.Context, finished func() map[string]uint64) error {
	old, err := c.js.KeyValue(ctx, protocol.KeysBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("open old bucket %s: %w", protocol.KeysBucket, err)
	}
	entries, err := loadAll(ctx, old, ">")
	if err != nil {
		return fmt.Errorf("load old bucket %s: %w", protocol.KeysBucket, err)
	}
	var msgs []*nats.Msg
	flush := func() error {
		if len(msgs) > 0 {
			if _, err := c.publishAtomic(ctx, msgs); err != nil {
				return fmt.Errorf("move bindings from %s: %w", protocol.KeysBucket, err)
			}
		}
		msgs = msgs[:0]
		return nil
	}
	for _, e := range entries {
		c.mu.Lock()
		kept := c.keepBinding(e.Key(), e.Value(), finished())
		c.unlock()
		if !kept {
			continue
		}
		m := nats.NewMsg(jobsSubjects + e.Key()) // the same encoding
		m.Data = e.Value()
		c.termChecked(m)
		if msgs = append(msgs, m); len(msgs) == 500 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	c.log.Info("moved idempotency bindings into the jobs bucket", "from", protocol.KeysBucket, "bindings", len(entries))
	return c.js.DeleteKeyValue(ctx, protocol.KeysBucket)
}

// loadAll reads every current entry of a bucket whose key matches filter.
func loadAll(ctx context.Context, kv jetstream.KeyValue, filter string) ([]jetstream.KeyValueEntry, error) {
	w, err := kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	var out []jetstream.KeyValueEntry
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("watch closed before the initial values were read")
			}
			if e == nil {
				return out, nil
			}
			out = append(out, e)
		}
	}
}
