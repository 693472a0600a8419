package coordinator

import (
	"context"
	"fmt"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// markDirty records a change to j and queues it for a committer; fn, if not nil, runs
// once the change is durable. Called with the scheduler's mu held.
func (s *scheduler) markDirty(j *job, fn func(error)) {
	j.version++
	// Never before the job's creation or its last change, though the clock steps back
	// (createdAt never does: lifecycle.go).
	j.rec.UpdatedAt = max(s.now().UnixMilli(), j.rec.UpdatedAt, j.rec.CreatedAt)
	if j.rec.State.Terminal() && j.rec.EndedAt == 0 {
		j.rec.EndedAt = j.rec.UpdatedAt
	}
	s.delayed.countState(j.seen, j.rec.State) // before note.changed moves seen on
	s.ready.countJob(queueOf(j), j.seen, j.rec.State)
	s.note.changed(j)
	s.ended(j) // deps.go
	if fn != nil {
		j.wait(waiter{version: j.version, fn: fn})
	}
	if !j.writing {
		s.wq.queueWrite(j)
	}
}

// queueWrite hands j to the committers. Called with the scheduler's mu held.
func (q *writeQueue) queueWrite(j *job) {
	j.writing = true
	q.writes++
	q.dirty = append(q.dirty, j)
	q.wakeWriter()
}

// doneWriting releases j from the committers. Called with the scheduler's mu held.
func (q *writeQueue) doneWriting(j *job) {
	j.writing = false
	q.writes--
}

func (q *writeQueue) wakeWriter() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// maxBatchJobs bounds the jobs one batch carries (each takes one or two messages of
// JetStream's 1,000 per atomic batch).
const maxBatchJobs = 256

// committer hands dirty jobs to the store until ctx ends, as many at a time as are
// waiting (up to maxBatchJobs): the store writes them its way (jobstore.go). Changes
// made while a job is in flight are coalesced into its next write, so a job has at
// most one write in flight and each is a CAS on the revision the previous one
// returned.
func (s *scheduler) committer(ctx context.Context) {
	for {
		s.mu.Lock()
		ws, err := s.wq.takeDirty(maxBatchJobs)
		s.unlock()
		for _, e := range err {
			s.fail(e.j, e.err)
		}
		if len(ws) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-s.wq.wake:
				continue
			}
		}
		if !s.store.write(ctx, ws) {
			return
		}
	}
}

type encodeError struct {
	j   *job
	err error
}

// takeDirty encodes up to n dirty jobs. Called with the scheduler's mu held.
func (q *writeQueue) takeDirty(n int) ([]pendingWrite, []encodeError) {
	n = min(n, len(q.dirty))
	if n == 0 {
		return nil, nil
	}
	ws := make([]pendingWrite, 0, n)
	var bad []encodeError
	for _, j := range q.dirty[:n] {
		w, err := q.pendingWrite(j)
		if err != nil {
			bad = append(bad, encodeError{j, fmt.Errorf("encode job %s: %w", j.rec.JobID, err)})
			continue
		}
		ws = append(ws, w)
	}
	clear(q.dirty[:n])
	if n == len(q.dirty) {
		q.dirty = q.dirty[:0] // its backing again: taking from the front used it up
	} else {
		q.dirty = q.dirty[n:]
	}
	if len(q.dirty) > 0 {
		q.wakeWriter()
	}
	return ws, bad
}

// pendingWrite encodes j's record. Called with the scheduler's mu held.
func (q *writeQueue) pendingWrite(j *job) (pendingWrite, error) {
	data, err := j.rec.AppendJSON(nil)
	return pendingWrite{
		j: j, id: j.rec.JobID, key: j.rec.IdempotencyKey, data: data,
		rev: j.rev, version: j.version, seq: j.rec.Seq, state: j.rec.State,
		ttl:     q.ttl(j.rec.EndedAt),
		expires: time.UnixMilli(j.rec.EndedAt).Add(q.cfg.Retention).UnixMilli(),
		runAt:   scheduledAt(&j.rec),
		queue:   scheduledIn(&j.rec),
		bind:    binding{JobID: j.rec.JobID, Fingerprint: j.rec.Fingerprint},
		// uniqueUntil: the record of a job that holds its unique key past its end
		// says so in a header, for recovery (unique.go).
		uniqueUntil: heldUntil(&j.rec),
	}, err
}

// ttlMargin is how much longer JetStream keeps a finished record than this coordinator
// keeps the job, which it forgets on its own clock (expire), so that status, lists and
// the key agree: TTLs are whole seconds, and JetStream's expiry wheel may fire up to a
// tick early.
const ttlMargin = 2 * time.Second

// ttl is what is left of the retention of a job that ended at endedAt (milliseconds;
// 0 while active), at least JetStream's smallest TTL; 0 keeps the job for ever.
func (q *writeQueue) ttl(endedAt int64) time.Duration {
	return recordTTL(q.cfg.Retention, q.s.now(), endedAt)
}

// recordTTL is writeQueue.ttl for a retention and the time now.
func recordTTL(retention time.Duration, now time.Time, endedAt int64) time.Duration {
	if endedAt == 0 || retention == 0 {
		return 0
	}
	left := retention - now.Sub(time.UnixMilli(endedAt))
	return max((left+time.Second-1).Truncate(time.Second), time.Second) + ttlMargin
}

// written records a durable write and runs the waiters it satisfied.
func (s *scheduler) written(j *job, rev, version uint64) {
	s.writtenAll([]ackedWrite{{j, rev, version}})
}

// writtenAll records durable writes and runs the waiters they satisfied: those that
// run under the scheduler's mu (an assignment's) in one hold of it, so that the
// assignments they release leave in one flush of the outbox, merged per worker where
// it takes batches (outbox.go); then the others, in order.
func (s *scheduler) writtenAll(ws []ackedWrite) {
	var buf [16]waiter // the waiters taken, copied out of their jobs (takeWaiters)
	done := buf[:0]
	s.mu.Lock()
	for _, w := range ws {
		done = s.recordWritten(w.j, w.rev, w.version, done)
	}
	n := 0
	for _, w := range done {
		if w.locked {
			w.fn(nil)
			continue
		}
		done[n] = w
		n++
	}
	s.unlock()
	for _, w := range done[:n] {
		w.fn(nil)
	}
}

// recordWritten records j's durable write of version at rev, and appends the waiters it
// satisfied to done. Called with the scheduler's mu held.
func (s *scheduler) recordWritten(j *job, rev, version uint64, done []waiter) []waiter {
	j.rev = rev
	j.stored = version
	j.uncertain = false
	s.note.written(j, version)
	s.ckpt.count(len(s.kept.index.entries))
	done = takeWaiters(j, version, done)
	s.wq.doneWriting(j)
	if j.version > version { // changed while being written
		s.wq.queueWrite(j)
	} else if j.rec.State.Terminal() && s.jobs[j.rec.JobID] == j {
		s.retire(j)
	} else if s.chillable(j, version) {
		s.chill(j) // SCHEDULED far ahead: its entry and due time stay (delayed.go)
	}
	return done
}

// fail ends every waiter of j with err.
func (s *scheduler) fail(j *job, err error) {
	var buf [4]waiter
	s.mu.Lock()
	done := takeWaiters(j, ^uint64(0), buf[:0])
	s.wq.doneWriting(j)
	n := 0
	for _, w := range done {
		if w.locked {
			w.fn(err)
			continue
		}
		done[n] = w
		n++
	}
	s.unlock()
	for _, w := range done[:n] {
		w.fn(err)
	}
}

// giveUp ends j's waiters with err and, if j was never stored, removes it as if it had
// not been submitted.
func (s *scheduler) giveUp(j *job, err error) {
	s.fail(j, err)
	s.dropUnstored(j)
}

// dropUnstored removes a job that was never stored, as if it had not been submitted:
// its submitter got an error, not an id.
func (s *scheduler) dropUnstored(j *job) {
	s.mu.Lock()
	defer s.unlock()
	if j.rev != 0 || s.jobs[j.rec.JobID] != j {
		return
	}
	delete(s.jobs, j.rec.JobID)
	if k := j.rec.IdempotencyKey; k != "" && s.keys[k] == j {
		delete(s.keys, k)
	}
	s.kept.index.remove(j.rec.Seq)
	if j.rec.State.Active() {
		s.active--
	}
	s.delayed.countState(j.seen, "")
	s.ready.countJob(queueOf(j), j.seen, "")
	s.ready.forget(j)
	s.forgetWaiting(j)                        // deps.go
	s.parentNotStored(j)                      // deps.go
	if j.rec.State == protocol.StateRunning { // assigned at once; its assignment never went
		if w := s.reg.workers[j.rec.WorkerID]; w != nil && w.running[j.rec.JobID].attempt == j.rec.AttemptID {
			delete(w.running, j.rec.JobID)
		}
		s.deadlines.remove(j)
		s.route.leaseEnded(j)
		s.flow.unstarted(queueOf(j), j.rec.TaskType)
		s.schedule()
	}
}

// retire moves a finished job whose record is durable out of memory: only its entry,
// and its key's binding, stay until its retention ends. Called with s.mu held.
func (s *scheduler) retire(j *job) {
	delete(s.jobs, j.rec.JobID)
	if k := j.rec.IdempotencyKey; k != "" && s.keys[k] == j {
		delete(s.keys, k)
	}
	s.kept.retire(j)
	s.uniq.retired(j)
}

// takeCreates takes the jobs waiting for their first write out of the queue. Called
// with the scheduler's mu held.
func (q *writeQueue) takeCreates() []*job {
	var gone []*job
	kept := q.dirty[:0]
	for _, j := range q.dirty {
		if j.rev == 0 && !j.uncertain { // an uncertain create waits (dropCreates)
			gone = append(gone, j)
		} else {
			kept = append(kept, j)
		}
	}
	clear(q.dirty[len(kept):])
	q.dirty = kept
	return gone
}

// writeQueue is the jobs whose records changed since their last write, in the order
// they changed, until the committer takes them (dirty), and how many jobs are queued
// or being written (writes). Each job is in it at most once (job.writing): changes
// made while it waits or is written are coalesced into its next write. Guarded by the
// scheduler's mu, but for wake, which wakes the committer.
type writeQueue struct {
	s      *scheduler
	cfg    *Config
	dirty  []*job
	writes int
	wake   chan struct{}
}

// takeWaiters removes from j the waiters that its durable version satisfies and
// appends them to into. Called with the scheduler's mu held.
func takeWaiters(j *job, version uint64, into []waiter) []waiter {
	n := 0
	for n < len(j.waiters) && j.waiters[n].version <= version {
		n++
	}
	// Copied out: the job's backing (waitBuf) takes its next waiters while these
	// still run, outside the lock.
	into = append(into, j.waiters[:n]...)
	clear(j.waiters[:n])
	j.waiters = j.waiters[n:]
	return into
}

// wait adds w to j's waiters, in j's own backing (waitBuf) when it has none. Called
// with the scheduler's mu held.
func (j *job) wait(w waiter) {
	if len(j.waiters) == 0 {
		j.waiters = j.waitBuf[:0]
	}
	j.waiters = append(j.waiters, w)
}

// refuseWaitingCreates gives up, with err, the jobs waiting for their first write:
// behind a write that keeps failing (a batching committer retries one batch until it
// lands; the pipeline's slots fill up) their submitters would otherwise hear nothing.
func (s *scheduler) refuseWaitingCreates(err error) {
	s.mu.Lock()
	gone := s.wq.takeCreates()
	s.unlock()
	for _, j := range gone {
		s.giveUp(j, err)
	}
}
