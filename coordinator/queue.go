package coordinator

import (
	"container/heap"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// readyQueue holds the QUEUED jobs, where dispatch (schedule, lifecycle.go) finds them.
// It is partitioned, with no order across the parts: by named queue (jobQueue), then by
// task type (typeLane), then by concurrency key (keyLane, "" for jobs without one),
// then by base priority. A worker chooses among the queues it serves (by weight, or in
// strict order: dispatch.go); within a queue, each task type offers the job its key
// rotation has next, and the best of those (by effective priority, then submission
// sequence) starts. Keys take turns (round robin), so that a key with 100,000 jobs
// holds another key's one job back by at most one start; within a key, priority and
// aging order the jobs.
//
// Each priority level of a key is a heap ordered by aging start (Record.AgingFrom),
// then sequence: its head has the highest effective priority of its level, so the best
// job of a key is the best of three heads, O(log n) per start however many wait.
//
// Entries are removed lazily: an entry whose job left QUEUED, or was queued again
// since, is dropped when it reaches a head. Guarded by the scheduler's mu.
type readyQueue struct {
	queues    map[string]*jobQueue
	size      int       // live entries in all queues, stale ones excluded
	round     uint64    // the dispatch pass (dispatch.go)
	collected time.Time // when idle queues were last forgotten (dispatch.go)
}

// jobQueue is one named queue: its jobs waiting, its settings, and what it runs.
type jobQueue struct {
	name     string
	settings protocol.QueueSettings
	rev      uint64 // revision of its stored settings (controls); 0: none stored
	byType   map[string]*typeLane
	size     int            // live entries
	running  int            // its RUNNING jobs (leases)
	keyRuns  map[string]int // its RUNNING jobs by concurrency key, "" not counted

	started, throttled uint64
	throttledRound     uint64 // the dispatch pass last counted in throttled
	perSec             [60]uint32
	perSecAt           [60]int64 // the Unix second perSec[i] counts
	used               bool      // a job came since the last collect (dispatch.go)
	// unfinished is its jobs not finished, in any state (SCHEDULED, WAITING, QUEUED,
	// RUNNING, RETRY_WAIT), held whole or, far SCHEDULED ones, by their entry: while it
	// has any, the queue is kept (collect), so that it can be paused before they start.
	unfinished int
}

// typeLane is the jobs of one task type in one queue, by concurrency key.
type typeLane struct {
	q        *jobQueue
	taskType string
	keys     map[string]*keyLane
	// ring is the keys whose turn comes, from ring[head]: each has jobs waiting and
	// is not at its concurrency limit (or was not when last looked at).
	ring []*keyLane
	head int
	size int
}

// keyLane is the jobs of one concurrency key of one task type in one queue.
type keyLane struct {
	t      *typeLane
	key    string
	levels [3]seqHeap
	size   int
	inRing bool
	// parked: out of the ring at its key's concurrency limit, until one of the key's
	// jobs ends (leaseEnded).
	parked bool
}

type queued struct {
	j   *job
	at  int64 // aging from (Record.AgingFrom)
	seq uint64
	gen uint64
}

func newReadyQueue() *readyQueue {
	return &readyQueue{queues: make(map[string]*jobQueue)}
}

// queue returns the queue named name ("" is the default), creating it.
func (r *readyQueue) queue(name string) *jobQueue {
	name = protocol.QueueOf(name)
	if q := r.queues[name]; q != nil {
		return q
	}
	q := &jobQueue{name: name, byType: make(map[string]*typeLane), keyRuns: make(map[string]int)}
	r.queues[name] = q
	return q
}

// countJob counts a job of the queue named name in or out of the queue's unfinished
// jobs as it moves from state from to state to ("": none, a job not yet made or gone).
func (r *readyQueue) countJob(name string, from, to protocol.State) {
	if from.Active() == to.Active() {
		return
	}
	if to.Active() {
		r.queue(name).unfinished++
	} else if q := r.queues[protocol.QueueOf(name)]; q != nil {
		q.unfinished--
	}
}

// waiting reports whether the queue named name has jobs waiting.
func (r *readyQueue) waiting(name string) bool {
	q := r.queues[protocol.QueueOf(name)]
	return q != nil && q.size > 0
}

// push makes queued job j ready, once: a job already in the queue stays where it is.
// Two paths may queue the same job (its create's landing, and its retry's backoff
// ending while that create stalled), and a second entry would count it twice.
func (r *readyQueue) push(j *job) {
	if j.inQueue {
		return
	}
	q := r.queue(queueOf(j))
	tl := q.byType[j.rec.TaskType]
	if tl == nil {
		tl = &typeLane{q: q, taskType: j.rec.TaskType, keys: make(map[string]*keyLane)}
		q.byType[j.rec.TaskType] = tl
	}
	key := keyOf(j)
	kl := tl.keys[key]
	if kl == nil {
		kl = &keyLane{t: tl, key: key}
		tl.keys[key] = kl
	}
	j.queueGen++
	j.inQueue = true
	j.lane = kl
	kl.levels[j.rec.Priority.Level()].push(queued{j: j, at: agingFrom(j), seq: j.rec.Seq, gen: j.queueGen})
	kl.size++
	tl.size++
	q.size++
	q.used = true
	r.size++
	if !kl.inRing && !kl.parked {
		kl.inRing = true
		tl.ring = append(tl.ring, kl)
	}
}

// forget is called when a queued job leaves QUEUED other than by pop (cancel).
func (r *readyQueue) forget(j *job) {
	if !j.inQueue {
		return
	}
	j.queueGen++
	j.inQueue = false
	r.left(j)
}

// waitedLonger reports whether a began to wait before b (submission order among equals).
func waitedLonger(a, b *job) bool {
	if fa, fb := a.rec.AgingFrom(), b.rec.AgingFrom(); fa != fb {
		return fa < fb
	}
	return a.rec.Seq < b.rec.Seq
}

// pop removes j, which dispatch just chose: the head of its key's level, its key the
// one whose turn it was. The key goes to the back of the ring.
func (r *readyQueue) pop(j *job) {
	kl := j.lane
	kl.levels[j.rec.Priority.Level()].pop()
	j.queueGen++
	j.inQueue = false
	r.left(j)
	tl := kl.t
	if tl.head < len(tl.ring) && tl.ring[tl.head] == kl && len(tl.ring)-tl.head > 1 {
		tl.ring[tl.head] = nil
		tl.head++
		if kl.size > 0 {
			tl.ring = append(tl.ring, kl)
		} else {
			kl.inRing = false
		}
		tl.compact()
	}
}

// left counts j out of its lanes.
func (r *readyQueue) left(j *job) {
	kl := j.lane
	j.lane = nil
	kl.size--
	kl.t.size--
	kl.t.q.size--
	r.size--
}

// compact moves the ring's live part to its start once the dead part is the larger.
func (tl *typeLane) compact() {
	if tl.head >= 32 && tl.head*2 >= len(tl.ring) {
		n := copy(tl.ring, tl.ring[tl.head:])
		clear(tl.ring[n:])
		tl.ring = tl.ring[:n]
		tl.head = 0
	}
}

// front returns the key whose turn it is, dropping from the ring the keys with no job
// left (an empty key stays known until collect, dispatch.go, so that a key's steady
// flow of jobs allocates nothing here) and parking those at their limit (limit: the most RUNNING jobs a key of this
// lane may have; 0 is unbounded).
func (tl *typeLane) front(limit int) *keyLane {
	for tl.head < len(tl.ring) {
		kl := tl.ring[tl.head]
		switch {
		case kl.size == 0:
		case kl.key != "" && limit > 0 && tl.q.keyRuns[kl.key] >= limit:
			kl.parked = true
		default:
			return kl
		}
		kl.inRing = false
		tl.ring[tl.head] = nil
		tl.head++
	}
	tl.ring, tl.head = tl.ring[:0], 0
	return nil
}

// best returns the key's job to run next and its effective priority.
func (kl *keyLane) best(now time.Time, aging time.Duration) (*job, int) {
	var best *job
	bestEff := -1
	for l := range kl.levels {
		e, ok := kl.levels[l].head()
		if !ok {
			continue
		}
		eff := effectivePriority(e.j.rec.Priority, e.at, now, aging)
		if eff > bestEff || (eff == bestEff && waitedLonger(e.j, best)) {
			best, bestEff = e.j, eff
		}
	}
	return best, bestEff
}

// unpark puts back in turn the keys of q named key, once a job of it ended; limitOf
// gives a lane's limit.
func (q *jobQueue) unpark(key string, limitOf func(*typeLane) int) {
	for _, tl := range q.byType {
		kl := tl.keys[key]
		if kl == nil || !kl.parked {
			continue
		}
		if kl.size == 0 {
			kl.parked = false // it takes turns again with its next job
			continue
		}
		if l := limitOf(tl); l > 0 && q.keyRuns[key] >= l {
			continue
		}
		kl.parked, kl.inRing = false, true
		tl.ring = append(tl.ring, kl)
	}
}

// unparkAll puts back in turn every parked key below its limit (a limit was raised).
func (q *jobQueue) unparkAll(limitOf func(*typeLane) int) {
	for _, tl := range q.byType {
		for key, kl := range tl.keys {
			if kl.parked {
				q.unpark(key, limitOf)
			}
		}
	}
}

// oldest returns the earliest aging start of q's waiting jobs; ok is false when none waits.
func (q *jobQueue) oldest() (at int64, ok bool) {
	for _, tl := range q.byType {
		for _, kl := range tl.keys {
			for l := range kl.levels {
				if e, live := kl.levels[l].head(); live && (!ok || e.at < at) {
					at, ok = e.at, true
				}
			}
		}
	}
	return at, ok
}

// keys counts the concurrency keys with jobs waiting.
func (q *jobQueue) keys() int {
	n := 0
	for _, tl := range q.byType {
		for _, kl := range tl.keys {
			if kl.size > 0 {
				n++
			}
		}
	}
	return n
}

// startedAt counts a start at now in the last minute's rate.
func (q *jobQueue) startedAt(now time.Time) {
	q.started++
	sec := now.Unix()
	i := int(uint64(sec) % 60)
	if q.perSecAt[i] != sec {
		q.perSecAt[i], q.perSec[i] = sec, 0
	}
	q.perSec[i]++
}

// perMinute is the starts of the 60 seconds up to now.
func (q *jobQueue) perMinute(now time.Time) int {
	sec, n := now.Unix(), 0
	for i, at := range q.perSecAt {
		if at > sec-60 && at <= sec {
			n += int(q.perSec[i])
		}
	}
	return n
}

type seqHeap []queued

func (h seqHeap) Len() int { return len(h) }
func (h seqHeap) Less(a, b int) bool {
	if h[a].at != h[b].at {
		return h[a].at < h[b].at
	}
	return h[a].seq < h[b].seq
}
func (h seqHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }

// head returns the first live entry, dropping stale entries on the way.
func (h *seqHeap) head() (queued, bool) {
	for h.Len() > 0 {
		e := (*h)[0]
		if e.j.rec.State == protocol.StateQueued && e.j.queueGen == e.gen {
			return e, true
		}
		h.pop()
	}
	return queued{}, false
}

// push and pop are container/heap's, without boxing each entry in an interface (an
// allocation per push and per pop on dispatch's path).
func (h *seqHeap) push(e queued) {
	*h = append(*h, e)
	for i := len(*h) - 1; i > 0; {
		parent := (i - 1) / 2
		if !h.Less(i, parent) {
			break
		}
		h.Swap(i, parent)
		i = parent
	}
}

func (h *seqHeap) pop() {
	old := *h
	n := len(old) - 1
	old[0] = old[n]
	old[n] = queued{}
	*h = old[:n]
	for i := 0; ; {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.Less(r, l) {
			m = r
		}
		if !h.Less(m, i) {
			break
		}
		h.Swap(i, m)
		i = m
	}
}

// deadlineHeap holds the RUNNING jobs by the deadline of their attempt. An attempt that
// ends leaves it at once (remove), so the heap holds running attempts only, not every
// attempt of the last TaskTimeout.
type deadlineHeap []*job

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(a, b int) bool { return h[a].deadline.Before(h[b].deadline) }
func (h deadlineHeap) Swap(a, b int) {
	h[a], h[b] = h[b], h[a]
	h[a].deadlineAt, h[b].deadlineAt = a+1, b+1
}
func (h *deadlineHeap) Push(x any) {
	j := x.(*job)
	*h = append(*h, j)
	j.deadlineAt = len(*h)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	j := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	j.deadlineAt = 0
	return j
}

// remove takes j out, if it is in.
func (h *deadlineHeap) remove(j *job) {
	if j.deadlineAt > 0 {
		heap.Remove(h, j.deadlineAt-1)
	}
}

// due pops every job whose deadline is at or before now.
func (h *deadlineHeap) due(now time.Time) []*job {
	var out []*job
	for h.Len() > 0 && !(*h)[0].deadline.After(now) {
		out = append(out, heap.Pop(h).(*job))
	}
	return out
}
