package coordinator

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
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
// active jobs only, and the idempotency bindings. A RUNNING job's attempt was lost
// with the previous coordinator: it counts, and the job runs again or, if that was its
// last attempt, fails.
func (c *Coordinator) recover(ctx context.Context) error {
	heads, lastSeq, err := c.loadHeads(ctx)
	if err != nil {
		return fmt.Errorf("load %s: %w", protocol.JobsBucket, err)
	}
	var whole []string                  // active jobs, and records older than the headers
	finished := make(map[string]uint64) // id -> sequence
	for _, h := range heads {
		if h.state == "" || h.state.Active() {
			whole = append(whole, h.id)
		} else {
			finished[h.id] = h.seq
		}
	}
	recs, err := c.loadRecords(ctx, whole)
	if err != nil {
		return fmt.Errorf("load %s: %w", protocol.JobsBucket, err)
	}
	c.mu.Lock()
	c.index.entries = slices.Grow(c.index.entries, len(heads))
	for _, h := range heads {
		if _, ok := finished[h.id]; ok {
			c.restoreFinished(h.seq, h.id, h.state, h.at, h.expires)
		}
	}
	for _, r := range recs {
		if r.State.Terminal() && r.EndedAt != 0 { // finished since its headers were read
			finished[r.JobID] = r.Seq
		}
		c.restore(r.Record, r.rev)
	}
	c.index.sort()
	slices.SortFunc(c.expiring, func(a, b expiring) int { return cmp.Compare(a.at, b.at) })
	// Every job took at least one message of the stream, so its last sequence bounds
	// every job sequence ever given, those of expired jobs included. The last message
	// is this coordinator's term: a new store's first job is 1.
	c.seq = max(c.seq, lastSeq-1)
	c.unlock()
	if err := c.repairBindings(ctx, finished); err != nil {
		return err
	}
	// Reading a large store allocates far more than memory then keeps: give it back now
	// rather than at the runtime's leisure.
	if len(heads) > 10_000 {
		heads, recs, finished = nil, nil, nil
		debug.FreeOSMemory()
	}
	return nil
}

// head is what a record's headers tell: enough to list a finished job.
type head struct {
	id      string
	seq     uint64
	state   protocol.State // "" for a record written before the headers
	at      time.Time      // of the record's last write
	expires int64          // when the job's retention ends, Unix milliseconds; 0: never
}

// loadHeads reads the headers of every record in the jobs bucket (an ordered consumer
// that delivers headers only, the last message of each key), and the stream's last
// sequence.
func (c *Coordinator) loadHeads(ctx context.Context) ([]head, uint64, error) {
	stream, err := c.js.Stream(ctx, "KV_"+protocol.JobsBucket)
	if err != nil {
		return nil, 0, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, 0, err
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil, last, nil
	}
	prefix := "$KV." + protocol.JobsBucket + "."
	var heads []head
	err = lastPerSubject(ctx, stream, recordsFilter, true, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) {
		h := msg.Headers()
		if h.Get("KV-Operation") != "" || h.Get("Nats-Marker-Reason") != "" { // a removal
			return
		}
		seq, _ := strconv.ParseUint(h.Get(protocol.HeaderSeq), 10, 64)
		st, _ := protocol.ParseState(h.Get(protocol.HeaderState)) // the constant, not a copy per job
		expires, _ := strconv.ParseInt(h.Get(protocol.HeaderExpires), 10, 64)
		heads = append(heads, head{
			id:  strings.Clone(strings.TrimPrefix(msg.Subject(), prefix)),
			seq: seq, state: st, at: meta.Timestamp, expires: expires,
		})
	})
	return heads, last, err
}

// lastPerSubject hands fn the last message of each subject of stream that matches
// filter (only its headers if headersOnly), through an ordered consumer that it
// deletes when done, rather than leave it to time out.
func lastPerSubject(ctx context.Context, stream jetstream.Stream, filter string, headersOnly bool, fn func(jetstream.Msg, *jetstream.MsgMetadata)) error {
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		HeadersOnly:    headersOnly,
		FilterSubjects: []string{filter},
	})
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
		c.restoreFinished(r.Seq, r.JobID, r.State, time.UnixMilli(max(r.EndedAt, r.UpdatedAt)), 0)
		return
	}
	j := &job{rec: r, rev: rev, seen: r.State}
	c.jobs[r.JobID] = j
	c.index.add(entry{seq: r.Seq, id: r.JobID, state: r.State, j: j})
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
		j.rec.WorkerID, j.rec.AttemptID = "", ""
		if r.Attempts >= r.MaxAttempts {
			j.rec.State = protocol.StateFailed
			j.rec.Error = ptr("coordinator restarted during final attempt; outcome unknown")
			c.active--
		} else {
			j.rec.State = protocol.StateQueued
			c.ready.push(j)
		}
		c.markDirty(j, nil)
	}
}

// restoreFinished adds a finished job, known by its entry only, whose record was last
// written at written. A record keeps the retention it was written with (expires, Unix
// milliseconds; 0 if it has none), as its TTL in JetStream does.
// Called with c.mu held.
func (c *Coordinator) restoreFinished(seq uint64, id string, st protocol.State, written time.Time, expires int64) {
	c.seq = max(c.seq, seq)
	if expires == 0 && c.cfg.Retention > 0 {
		expires = written.Add(c.cfg.Retention).UnixMilli()
	}
	if expires > 0 && expires <= c.now().UnixMilli() {
		return // its retention ended: JetStream removes the record on its own
	}
	c.index.add(entry{seq: seq, id: id, state: st})
	if expires > 0 {
		c.expiring = append(c.expiring, expiring{at: expires, seq: seq})
	}
}

// repairBindings rebuilds the idempotency bindings of finished jobs (doneKeys) from
// the bindings stored beside the records, keeping the records as the truth: a binding
// whose job is gone or unknown is left alone, free to be written over. Bindings left
// in the bucket of earlier versions (protocol.KeysBucket) are moved first.
func (c *Coordinator) repairBindings(ctx context.Context, finished map[string]uint64) error {
	if err := c.moveOldBindings(ctx, finished); err != nil {
		return err
	}
	stream, err := c.js.Stream(ctx, jobsStream)
	if err != nil {
		return fmt.Errorf("load bindings: %w", err)
	}
	err = lastPerSubject(ctx, stream, jobsSubjects+protocol.KeyPrefix+">", false, func(msg jetstream.Msg, _ *jetstream.MsgMetadata) {
		if msg.Headers().Get("KV-Operation") != "" || msg.Headers().Get("Nats-Marker-Reason") != "" {
			return
		}
		c.mu.Lock()
		c.keepBinding(strings.TrimPrefix(msg.Subject(), jobsSubjects), msg.Data(), finished)
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
	if e == nil || e.id != b.JobID {
		return false
	}
	e.key = string(raw)
	c.doneKeys[e.key] = doneKey{jobID: b.JobID, fingerprint: b.Fingerprint}
	return true
}

// moveOldBindings moves the bindings of kept jobs out of protocol.KeysBucket, where
// versions before the single jobs stream kept them, into the jobs bucket (fenced
// batches, as every write), then deletes that bucket.
func (c *Coordinator) moveOldBindings(ctx context.Context, finished map[string]uint64) error {
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
		kept := c.keepBinding(e.Key(), e.Value(), finished)
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
