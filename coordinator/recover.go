package coordinator

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// recover rebuilds memory from KV before anything is served, reading only what it
// needs to serve: every record's headers (its sequence and state), the whole record of
// active jobs only, and the idempotency bindings. A RUNNING job's attempt waits for its
// worker to claim it (claims.go); one nobody claims is lost: it counts, and the job
// runs again or, if that was its last attempt, fails.
func (s *scheduler) recover(ctx context.Context) error {
	ld, err := s.store.load(ctx)
	if err != nil {
		return fmt.Errorf("load %s: %w", protocol.JobsBucket, err)
	}
	heads, recs, lastSeq, fromCheckpoint := ld.heads, ld.records, ld.lastSeq, ld.fromCheckpoint
	// A SCHEDULED job due beyond the window was not read whole: it is kept by its
	// entry and due time, as a finished job by its entry (delayed.go).
	cold := func(h head) bool { return h.state != "" && !h.state.Terminal() && !readWhole(h, ld.coldAfter) }
	// id -> sequence of every job kept by its entry only (finished, or SCHEDULED far
	// ahead), for bindings read apart from the jobs; built only if some are (a million
	// entries take a while).
	finished := sync.OnceValue(func() map[string]uint64 {
		m := make(map[string]uint64)
		for _, h := range heads {
			if h.state != "" && h.state.Terminal() || cold(h) {
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
	s.mu.Lock()
	s.kept.index.entries = slices.Grow(s.kept.index.entries, len(heads))
	for _, h := range heads {
		switch {
		case h.state != "" && h.state.Terminal():
			s.seq = max(s.seq, h.seq)
			s.kept.restoreFinished(h)
		case cold(h):
			s.seq = max(s.seq, h.seq)
			s.kept.restoreCold(h)
		}
	}
	s.restoredCold()
	for _, r := range recs {
		s.restore(r.Record, r.rev, r.expires)
	}
	s.kept.index.sort()
	for i := range recs { // once the index is sorted: a finished one's entry is found
		s.uniq.restored(&recs[i].Record)
	}
	s.chillRestored() // delayed.go: far SCHEDULED jobs read whole leave memory
	slices.SortFunc(s.kept.expiring, func(a, b expiring) int { return cmp.Compare(a.at, b.at) })
	// Every job took at least one message of the stream, so its last sequence bounds
	// every job sequence ever given, those of expired jobs included. The last message
	// is this coordinator's term: a new store's first job is 1.
	s.seq = max(s.seq, lastSeq-1)
	if fromCheckpoint { // bindings written since the checkpoint
		for _, b := range ld.binds {
			s.kept.keepBinding(b.key, b.value, finished())
		}
	}
	s.unlock()
	keep := func(key string, value []byte) bool {
		s.mu.Lock()
		defer s.unlock()
		return s.kept.keepBinding(key, value, finished())
	}
	if err := s.store.bindings(ctx, !fromCheckpoint, keep); err != nil {
		return err
	}
	if err := s.flow.recoverLimits(ctx); err != nil {
		return err
	}
	// Reading a large store allocates far more than memory then keeps: give it back now
	// rather than at the runtime's leisure.
	if len(heads) > 10_000 {
		heads, recs, ld = nil, nil, nil
		debug.FreeOSMemory()
	}
	if err := s.recoverGroups(ctx); err != nil { // workflow.go
		return err
	}
	if err := s.recoverWaiting(ctx); err != nil { // deps.go
		return err
	}
	s.claims.start()
	return nil
}

// head is what a record's headers tell: enough to list a finished job.
type head struct {
	id      string
	seq     uint64
	state   protocol.State // "" for a record written before the headers
	at      time.Time      // of the record's last write
	expires int64          // when the job's retention ends, Unix milliseconds; 0: never
	due     int64          // a SCHEDULED job's due time, Unix milliseconds (delayed.go)
	// queue is a SCHEDULED job's queue (protocol.HeaderQueue), counted as holding a job
	// (queue.go); "" for a record of a release before the header, which is read whole.
	queue string

	key, fingerprint string // a finished job's idempotency binding, from a checkpoint

	uniqueUntil int64 // a unique key held past the headers (protocol.HeaderUniqueUntil); 0: none
}

// restore adds one stored job to memory: a finished one only as its entry, kept until
// expires (its record's end of retention; 0: none known), unless its record predates
// retention and must be written again with a TTL. Called with the scheduler's mu held.
func (s *scheduler) restore(r protocol.Record, rev uint64, expires int64) {
	s.seq = max(s.seq, r.Seq)
	s.lastMilli = max(s.lastMilli, r.CreatedAt)
	if r.State.Terminal() && (r.EndedAt != 0 || s.cfg.Retention == 0) {
		s.kept.restoreFinished(head{seq: r.Seq, id: r.JobID, state: r.State, at: time.UnixMilli(max(r.EndedAt, r.UpdatedAt)), expires: expires})
		return
	}
	j := &job{rec: r, rev: rev, seen: r.State}
	s.jobs[r.JobID] = j
	s.kept.index.add(r.Seq, r.JobID, r.State, "", j)
	if r.IdempotencyKey != "" {
		s.keys[r.IdempotencyKey] = j
	}
	if r.State.Terminal() { // written before retention: again, with its TTL
		j.rec.EndedAt = r.UpdatedAt
		j.version++
		s.wq.queueWrite(j)
		return
	}
	s.active++
	s.ready.countJob(queueOf(j), "", r.State)
	switch r.State {
	case protocol.StateQueued:
		s.ready.push(j)
	case protocol.StateRetryWait:
		s.pushRetry(j)
	case protocol.StateRunning:
		s.claims.await(j)
	case protocol.StateScheduled:
		s.restoreScheduled(j) // delayed.go
	} // WAITING: recoverWaiting
}

// restoreFinished adds a finished job, known by its entry only, whose record was last
// written at written. A record keeps the retention it was written with (expires, Unix
// milliseconds; 0 if it has none), as its TTL in JetStream does.
// Called with the scheduler's mu held.
func (rt *retention) restoreFinished(h head) {
	expires := h.expires
	if expires == 0 && rt.cfg.Retention > 0 {
		expires = h.at.Add(rt.cfg.Retention).UnixMilli()
	}
	if expires > 0 && expires <= rt.s.now().UnixMilli() {
		return // its retention ended: JetStream removes the record on its own
	}
	rt.index.add(h.seq, h.id, h.state, h.key, nil)
	if h.key != "" {
		rt.doneKeys[h.key] = doneKey{jobID: h.id, fingerprint: h.fingerprint}
	}
	if expires > 0 {
		rt.expiring = append(rt.expiring, expiring{at: expires, seq: h.seq})
	}
}

// keepBinding remembers the binding stored under k if its job is kept. Called with
// the scheduler's mu held.
func (rt *retention) keepBinding(k string, value []byte, finished map[string]uint64) bool {
	var b binding
	_ = json.Unmarshal(value, &b)
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(k, protocol.KeyPrefix))
	seq, ok := finished[b.JobID]
	if err != nil || !ok || rt.s.jobs[b.JobID] != nil {
		return rt.s.jobs[b.JobID] != nil // an active job's key comes with its record
	}
	e := rt.index.find(seq)
	if e == nil || !rt.index.hasID(e, b.JobID) {
		return false
	}
	rt.index.setKey(e, string(raw))
	rt.doneKeys[string(raw)] = doneKey{jobID: b.JobID, fingerprint: b.Fingerprint}
	return true
}
