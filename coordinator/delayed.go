package coordinator

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Delayed jobs: a submission with a run time (runAtMillis, runInMillis) or a snoozed
// attempt waits in SCHEDULED until it is due, then queues like any job (timers.go's
// wakeJob, becomeQueued).
//
// Memory. A SCHEDULED job due within Config.ScheduleWindow is held whole, with its
// timer. One due later is held, once its record is durable, like a finished job: by
// its index entry (retained.go: sequence, id, state) plus its due time in the cold
// heap, and its idempotency key's binding; its record stays in the store only. So a
// million far-future jobs cost what a million finished ones do. When the earliest of
// them comes within the window, the warmer reads their records back (a few at a time,
// off the lock) and arms their timers. Records of SCHEDULED jobs carry their due time
// in a header (protocol.HeaderRunAt), and checkpoints carry it for cold entries, so
// that recovery does not read them whole either.
//
// Admission. SCHEDULED jobs count against Config.MaxScheduledJobs, not MaxActiveJobs:
// a million jobs for next month must not refuse the work of today. A job that comes due
// queues whatever the active count; submissions due now are refused while the active
// jobs other than SCHEDULED ones are at MaxActiveJobs.

// delayed is the scheduler's SCHEDULED jobs: how many there are and the cold ones by
// due time. Guarded by the scheduler's mu.
type delayed struct {
	scheduled int      // SCHEDULED jobs, hot and cold (admission)
	cold      coldHeap // due later than the window: (due, sequence), stale entries skipped
	armed     time.Time
	warming   bool // the warmer is reading records
}

// coldEntry is a SCHEDULED job held by its index entry, due at at (Unix milliseconds).
type coldEntry struct {
	at  int64
	seq uint64
}

type coldHeap []coldEntry

func (h coldHeap) Len() int           { return len(h) }
func (h coldHeap) Less(a, b int) bool { return h[a].at < h[b].at }
func (h coldHeap) Swap(a, b int)      { h[a], h[b] = h[b], h[a] }
func (h *coldHeap) Push(x any)        { *h = append(*h, x.(coldEntry)) }
func (h *coldHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// warmBatch bounds the records the warmer reads at a time.
const warmBatch = 4096

// runTimeOf is the time a submission asks its job to run at (Unix milliseconds); 0
// runs it now. A time not after now is now.
func runTimeOf(req *protocol.SubmitJob, now time.Time) (int64, *protocol.Error) {
	if req.RunAtMillis == 0 && req.RunInMillis == 0 {
		return 0, nil
	}
	if len(req.After) > 0 { // WAITING, then SCHEDULED: not yet
		return 0, protocol.InvalidRunTime("a job with after waits for its parents; runAtMillis and runInMillis do not combine with it")
	}
	at, perr := protocol.CheckRunTime(req.RunAtMillis, req.RunInMillis, now.UnixMilli())
	if perr != nil {
		return 0, perr
	}
	if at <= now.UnixMilli() {
		return 0, nil
	}
	return at, nil
}

// scheduledAt is a SCHEDULED record's due time, 0 for a record in another state.
func scheduledAt(r *protocol.Record) int64 {
	if r.State == protocol.StateScheduled {
		return r.RunAt
	}
	return 0
}

// scheduledIn is a SCHEDULED record's queue (protocol.HeaderQueue), "" for a record in
// another state.
func scheduledIn(r *protocol.Record) string {
	if r.State == protocol.StateScheduled {
		return protocol.QueueOf(r.Queue)
	}
	return ""
}

// countState keeps the SCHEDULED count as a job moves from one state to another.
// Called with the scheduler's mu held, from markDirty (every change) and for the jobs
// recovery restores or drops.
func (d *delayed) countState(from, to protocol.State) {
	if from == to {
		return
	}
	if from == protocol.StateScheduled {
		d.scheduled--
	}
	if to == protocol.StateScheduled {
		d.scheduled++
	}
}

// admits refuses a new job when its kind is at its bound: SCHEDULED ones against
// MaxScheduledJobs, others against MaxActiveJobs counting no SCHEDULED job. Called with
// the scheduler's mu held.
func (s *scheduler) admits(scheduled bool) *protocol.SubmitRejected {
	if scheduled {
		if s.delayed.scheduled >= s.cfg.MaxScheduledJobs {
			return protocol.ScheduledAtCapacity(s.delayed.scheduled, s.cfg.MaxScheduledJobs)
		}
		return nil
	}
	if n := s.active - s.delayed.scheduled; n >= s.cfg.MaxActiveJobs {
		return protocol.AtCapacity(n, s.cfg.MaxActiveJobs)
	}
	return nil
}

// A SCHEDULED job's wake-up. A timer entry holds the job itself, so only a job that
// stays in memory gets one: one due within the window. One due later gets a cold entry
// (by sequence) instead, and its timer once the warmer finds it within the window; so
// chill never drops a job a timer holds. A job not yet stored gets its timer once it
// is (stored), so that a create that fails leaves no timer behind.

// near reports whether a job due at (Unix milliseconds) is due within the window.
func (s *scheduler) near(at int64) bool {
	return time.UnixMilli(at).Sub(s.now()) <= s.cfg.ScheduleWindow
}

// delay makes a new job, not yet stored, SCHEDULED until at. Called with the
// scheduler's mu held.
func (s *scheduler) delay(j *job, at int64) {
	j.rec.State, j.rec.RunAt = protocol.StateScheduled, at
	if !s.near(at) {
		s.coldAt(at, j.rec.Seq)
	}
}

// stored arms the timer of a SCHEDULED job whose create is durable, if it is due within
// the window and still in memory. Called with the scheduler's mu held.
func (s *scheduler) stored(j *job) {
	if s.jobs[j.rec.JobID] == j && s.near(j.rec.RunAt) {
		s.timers.wakeJob(j, time.UnixMilli(j.rec.RunAt))
	}
}

// snooze ends j's attempt, whose handler asked to run it again after ms, without using
// the attempt: SCHEDULED until then, one more snooze. The lease must already be
// released. Called with the scheduler's mu held.
func (s *scheduler) snooze(j *job, ms int64) {
	ms = min(ms, protocol.MaxRunAhead.Milliseconds())
	j.rec.Attempts--
	j.rec.Snoozes++
	j.rec.State = protocol.StateScheduled
	j.rec.RunAt = s.now().UnixMilli() + ms
	j.rec.RetryAt = 0
	s.arm(j)
	s.log.Debug("job snoozed", "job", j.rec.JobID, "until", j.rec.RunAt, "snoozes", j.rec.Snoozes)
}

// arm arms a stored SCHEDULED job's wake-up: a timer within the window, else a cold
// entry. Called with the scheduler's mu held.
func (s *scheduler) arm(j *job) {
	if s.near(j.rec.RunAt) {
		s.timers.wakeJob(j, time.UnixMilli(j.rec.RunAt))
		return
	}
	s.coldAt(j.rec.RunAt, j.rec.Seq)
}

// restoreScheduled arms a SCHEDULED job recovery read whole (chillRestored lets it
// leave memory if it is due beyond the window). Called with the scheduler's mu held.
func (s *scheduler) restoreScheduled(j *job) {
	s.delayed.countState("", protocol.StateScheduled)
	s.arm(j)
}

// chillRestored lets the SCHEDULED jobs recovery read whole leave memory if they are
// due beyond the window (their records are durable): once the index is sorted, in
// which chill finds their entries. Called with the scheduler's mu held.
func (s *scheduler) chillRestored() {
	for _, j := range s.jobs {
		if s.chillable(j, j.version) {
			s.chill(j)
		}
	}
}

// coldAt adds a cold entry and arms the warmer for it. Called with the scheduler's mu held.
func (s *scheduler) coldAt(at int64, seq uint64) {
	heap.Push(&s.delayed.cold, coldEntry{at: at, seq: seq})
	s.armWarmer()
}

// armWarmer makes the warmer run when the earliest cold entry comes within the window.
// Called with the scheduler's mu held.
func (s *scheduler) armWarmer() {
	d := &s.delayed
	if d.warming || d.cold.Len() == 0 {
		return
	}
	at := time.UnixMilli(d.cold[0].at).Add(-s.cfg.ScheduleWindow)
	if !d.armed.IsZero() && !at.Before(d.armed) {
		return // an earlier or equal call is armed
	}
	d.armed = at
	s.timers.call(at, s.warm)
}

// chillable reports whether j, whose write of version just became durable, may leave
// memory: SCHEDULED beyond the window, unchanged since, with nothing waiting on it
// (no waiter, and no child: the index of waiting jobs knows parents by their job in
// memory, deps.go). Called with the scheduler's mu held.
func (s *scheduler) chillable(j *job, version uint64) bool {
	return j.rec.State == protocol.StateScheduled && j.version == version && len(j.waiters) == 0 &&
		!j.writing && s.jobs[j.rec.JobID] == j && !s.near(j.rec.RunAt) && len(s.deps.children[j]) == 0
}

// chill moves a cold SCHEDULED job out of memory: its entry (state SCHEDULED, and its
// queue), its cold entry (already in the heap) and its key's binding stay. Called with
// the scheduler's mu held.
func (s *scheduler) chill(j *job) {
	r := &j.rec
	e := s.kept.index.find(r.Seq)
	if e == nil || e.j != j {
		return // not indexed (yet): it stays whole
	}
	delete(s.jobs, r.JobID)
	e.j = nil
	e.setState(protocol.StateScheduled)
	s.kept.index.setQueue(e, s.ready.queue(queueOf(j)).name) // its name, not a copy per job
	s.kept.index.countDone(e, 1)                             // counted by its entry now (jobCounts)
	if k := r.IdempotencyKey; k != "" {
		if s.keys[k] == j {
			delete(s.keys, k)
		}
		s.kept.index.setKey(e, k)
		s.kept.doneKeys[k] = doneKey{jobID: r.JobID, fingerprint: r.Fingerprint}
	}
}

// warm runs when the earliest cold entry comes within the window: it takes the cold
// entries due within it, arms the timers of those still in memory, and reads the
// others' records off the lock. Called with the scheduler's mu held (timers.call).
func (s *scheduler) warm(now time.Time) {
	d := &s.delayed
	d.armed = time.Time{}
	if d.warming || s.fenced != nil {
		return
	}
	until := now.Add(s.cfg.ScheduleWindow).UnixMilli()
	var ids []string
	var back []coldEntry
	for d.cold.Len() > 0 && d.cold[0].at <= until && len(ids) < warmBatch {
		c := heap.Pop(&d.cold).(coldEntry)
		e := s.kept.index.find(c.seq)
		switch {
		case e == nil:
		case e.j != nil:
			// One whose create is still in flight gets its timer once it is stored
			// (stored), so that a create that fails leaves no timer behind.
			if e.j.rev != 0 && e.j.rec.State == protocol.StateScheduled && e.j.rec.RunAt == c.at {
				s.timers.wakeJob(e.j, time.UnixMilli(c.at))
			}
		case e.state() == protocol.StateScheduled:
			ids = append(ids, s.kept.index.id(e))
			back = append(back, c)
		}
	}
	if len(ids) == 0 {
		s.armWarmer()
		return
	}
	d.warming = true
	s.run(func() { s.warmRead(ids, back) })
}

// warmRead reads the records of ids (cold entries back) and holds them whole with
// their timers; entries it could not read go back to the heap, to be tried again.
func (s *scheduler) warmRead(ids []string, back []coldEntry) {
	recs, failed := s.readRecords(ids)
	s.mu.Lock()
	defer s.unlock()
	s.delayed.warming = false
	for _, r := range recs {
		s.holdCold(r.Record, r.rev)
	}
	for i := range ids {
		if failed[ids[i]] {
			heap.Push(&s.delayed.cold, back[i])
		}
	}
	if len(failed) > 0 {
		retry := s.now().Add(time.Second)
		s.delayed.armed = retry
		s.timers.call(retry, s.warm)
		return
	}
	s.armWarmer()
}

// readRecords reads the records of ids, a few at a time; failed holds the ids whose
// read failed other than by their record's absence.
func (s *scheduler) readRecords(ids []string) ([]stored, map[string]bool) {
	var (
		mu     sync.Mutex
		out    []stored
		failed = make(map[string]bool)
		wg     sync.WaitGroup
		next   = make(chan string)
	)
	for range min(8, len(ids)) {
		wg.Go(func() {
			for id := range next {
				r, rev, err := s.readRecord(id)
				mu.Lock()
				switch {
				case errors.Is(err, errNoRecord):
				case err != nil:
					failed[id] = true
				default:
					out = append(out, stored{Record: r, rev: rev})
				}
				mu.Unlock()
			}
		})
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	if len(failed) > 0 {
		s.log.Warn("scheduled jobs not read back; trying again", "jobs", len(failed))
	}
	return out, failed
}

// readRecord reads job id's record with its revision.
func (s *scheduler) readRecord(id string) (protocol.Record, uint64, error) {
	var r protocol.Record
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	data, rev, err := s.store.readAt(ctx, id)
	if err != nil {
		return r, 0, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, 0, fmt.Errorf("read job %s: %w", id, err)
	}
	return r, rev, nil
}

// holdCold holds a cold SCHEDULED job whole again, from its record read back, with its
// timer: unless it is no longer cold (cancel warmed it first). Called with the
// scheduler's mu held.
func (s *scheduler) holdCold(r protocol.Record, rev uint64) *job {
	e := s.kept.index.find(r.Seq)
	if e == nil || !s.kept.index.hasID(e, r.JobID) {
		return nil
	}
	if e.j != nil {
		return e.j
	}
	if e.state() != protocol.StateScheduled || r.State != protocol.StateScheduled {
		return nil
	}
	j := &job{rec: r, rev: rev, seen: r.State}
	s.jobs[r.JobID] = j
	s.kept.index.countDone(e, -1) // counted as a job held whole now (jobCounts)
	e.j = j
	s.kept.index.setQueue(e, "") // its record names it
	if k := r.IdempotencyKey; k != "" {
		if d, ok := s.kept.doneKeys[k]; ok && d.jobID == r.JobID {
			delete(s.kept.doneKeys, k)
		}
		s.kept.index.setKey(e, "")
		s.keys[k] = j
	}
	s.arm(j) // a cold entry again if it is still far: a cancel holds it only to cancel it
	return j
}

// cancelCold cancels job id if it is a cold SCHEDULED job: it reads its record, holds
// it whole again and cancels it as any active job. false: it is not one (finished,
// or unknown), for the caller to answer.
func (s *scheduler) cancelCold(id string, due time.Duration, reply replyFunc) bool {
	if !protocol.IsRecordKey(id) {
		return false
	}
	r, rev, err := s.readRecord(id)
	if err != nil || r.State != protocol.StateScheduled {
		return false
	}
	s.mu.Lock()
	j := s.holdCold(r, rev)
	s.unlock()
	if j == nil {
		return false
	}
	s.cancelJob(id, due, reply)
	return true
}

// restoreCold adds a SCHEDULED job that recovery did not read whole (due beyond the
// window): its entry and its cold entry. Called with the scheduler's mu held.
func (rt *retention) restoreCold(h head) {
	s := rt.s
	q := s.ready.queue(h.queue)
	rt.index.add(h.seq, h.id, protocol.StateScheduled, h.key, nil)
	rt.index.setQueue(&rt.index.entries[len(rt.index.entries)-1], q.name)
	if h.key != "" {
		rt.doneKeys[h.key] = doneKey{jobID: h.id, fingerprint: h.fingerprint}
	}
	q.unfinished++
	s.active++
	s.delayed.scheduled++
	s.delayed.cold = append(s.delayed.cold, coldEntry{at: h.due, seq: h.seq}) // restoredCold orders them
}

// restoredCold orders the cold entries recovery restored and arms the warmer for them.
// Called with the scheduler's mu held.
func (s *scheduler) restoredCold() {
	heap.Init(&s.delayed.cold)
	s.armWarmer()
}

// coldDue maps the cold entries' sequences to their due times, for a checkpoint.
// Called with the scheduler's mu held.
func (d *delayed) coldDue() map[uint64]int64 {
	m := make(map[uint64]int64, len(d.cold))
	for _, c := range d.cold {
		m[c.seq] = c.at
	}
	return m
}

// readWhole says whether recovery reads a job of head h whole: an active job, unless
// it is SCHEDULED and due after cold (Unix milliseconds), and its head names its queue
// (one of a release before protocol.HeaderQueue is read to learn it).
func readWhole(h head, cold int64) bool {
	if h.state == protocol.StateScheduled && h.due > cold && h.queue != "" {
		return false
	}
	return h.state == "" || h.state.Active()
}
