package coordinator

import (
	"container/heap"
	"context"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// timers is the scheduler's one timer mechanism: every "later" of the lifecycle (a
// delayed job's run time, a retry's backoff, a snooze, a schedule's tick, the next
// token of a rate limit) is an entry here, and one driver goroutine wakes when the
// earliest is due. Entries are not durable: whoever leads re-arms them from durable
// state when it recovers. They fire only while this coordinator leads; a due entry
// waits otherwise. Guarded by scheduler.mu, except kick.
type timers struct {
	s    *scheduler
	h    wakeHeap
	seq  uint64        // ties break in arming order
	kick chan struct{} // an entry earlier than the driver's timer arrived
}

// wake is one entry: a job to make QUEUED if it still waits for at, or a function.
type wake struct {
	at  time.Time
	seq uint64
	j   *job
	fn  func(now time.Time)
}

func newTimers(s *scheduler) *timers {
	return &timers{s: s, kick: make(chan struct{}, 1)}
}

// wakeJob arms j's return to the queue at at: when it comes, j becomes QUEUED if it is
// still SCHEDULED with RunAt at, or still RETRY_WAIT with RetryAt at; any other entry
// of j is stale by then and skipped.
func (t *timers) wakeJob(j *job, at time.Time) { t.push(wake{at: at, j: j}) }

// call runs fn, under the scheduler's mutex, once at comes.
func (t *timers) call(at time.Time, fn func(now time.Time)) { t.push(wake{at: at, fn: fn}) }

func (t *timers) push(w wake) {
	t.seq++
	w.seq = t.seq
	first := t.h.Len() == 0 || w.at.Before(t.h[0].at)
	heap.Push(&t.h, w)
	if first {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// next is when the earliest entry is due; ok is false when there is none.
func (t *timers) next() (at time.Time, ok bool) {
	if t.h.Len() == 0 {
		return time.Time{}, false
	}
	return t.h[0].at, true
}

// fire runs every entry due at now, and reports whether it could: timers wait while
// this coordinator does not lead.
func (t *timers) fire(now time.Time) bool {
	s := t.s
	if s.fenced != nil || !s.lease.held() {
		return false
	}
	for t.h.Len() > 0 && !t.h[0].at.After(now) {
		w := heap.Pop(&t.h).(wake)
		if w.fn != nil {
			w.fn(now)
			continue
		}
		if due(w.j) == w.at.UnixMilli() {
			s.becomeQueued(w.j)
		}
	}
	s.schedule()
	return true
}

// due is when a waiting job is due to be queued, in Unix milliseconds; 0 if it waits
// for nothing timed.
func due(j *job) int64 {
	switch j.rec.State {
	case protocol.StateScheduled:
		return j.rec.RunAt
	case protocol.StateRetryWait:
		return j.rec.RetryAt
	}
	return 0
}

// becomeQueued moves j, waiting in SCHEDULED, RETRY_WAIT or WAITING, to QUEUED and
// into the ready queue. The caller schedules.
func (s *scheduler) becomeQueued(j *job) {
	j.rec.State = protocol.StateQueued
	j.rec.RetryAt = 0
	s.markDirty(j, nil)
	s.ready.push(j)
}

// run is the driver: it sleeps until the earliest entry is due (or an earlier one is
// armed) and fires what is due, until ctx ends. While this coordinator does not lead
// it looks again every idle.
func (t *timers) run(ctx context.Context, idle time.Duration) {
	clock := time.NewTimer(idle)
	defer clock.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.kick:
		case <-clock.C:
		}
		t.s.mu.Lock()
		wait := t.fireDue(idle)
		t.s.unlock()
		clock.Reset(wait)
	}
}

// fireDue fires what is due and returns how long the driver may sleep: until the next
// entry, at most idle (an injected clock, or leadership, may change what is due).
func (t *timers) fireDue(idle time.Duration) time.Duration {
	now := t.s.now()
	at, ok := t.next()
	if ok && !at.After(now) {
		if !t.fire(now) {
			return idle
		}
		at, ok = t.next()
	}
	if !ok {
		return idle
	}
	return min(idle, max(at.Sub(now), 0))
}

type wakeHeap []wake

func (h wakeHeap) Len() int { return len(h) }
func (h wakeHeap) Less(a, b int) bool {
	if h[a].at.Equal(h[b].at) {
		return h[a].seq < h[b].seq
	}
	return h[a].at.Before(h[b].at)
}
func (h wakeHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *wakeHeap) Push(x any)   { *h = append(*h, x.(wake)) }
func (h *wakeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = wake{}
	*h = old[:len(old)-1]
	return x
}
