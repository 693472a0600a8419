package coordinator

import (
	"container/heap"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// readyQueue holds QUEUED jobs: per task type, one heap per base priority ordered by
// when each began to wait (Record.AgingFrom), then submission sequence. The head of each
// heap has waited longest, so it has the highest effective (aged) priority of its
// level, and the best job overall is the best of the heads: O(log n) per assignment,
// however many jobs wait.
//
// Entries are removed lazily: an entry whose job left QUEUED, or was queued again
// since, is dropped when it reaches a head.
type readyQueue struct {
	byType map[string]*[3]seqHeap
	size   int // live entries, stale ones excluded
}

type queued struct {
	j    *job
	from int64 // Record.AgingFrom
	seq  uint64
	gen  uint64
}

func newReadyQueue() *readyQueue {
	return &readyQueue{byType: make(map[string]*[3]seqHeap)}
}

func (q *readyQueue) push(j *job) {
	j.queueGen++
	j.inQueue = true
	levels := q.byType[j.rec.TaskType]
	if levels == nil {
		levels = new([3]seqHeap)
		q.byType[j.rec.TaskType] = levels
	}
	heap.Push(&levels[j.rec.Priority.Level()], queued{j: j, from: j.rec.AgingFrom(), seq: j.rec.Seq, gen: j.queueGen})
	q.size++
}

// forget is called when a queued job leaves QUEUED other than by pop (cancel).
func (q *readyQueue) forget(j *job) {
	if j.inQueue {
		j.queueGen++
		j.inQueue = false
		q.size--
	}
}

// best returns the job to run next among the task types runnable says a free worker
// can take, without removing it.
func (q *readyQueue) best(now time.Time, aging time.Duration, runnable func(taskType string) bool) *job {
	var best *job
	bestEff := -1
	for taskType, levels := range q.byType {
		if !runnable(taskType) {
			continue
		}
		for l := range levels {
			j := levels[l].head()
			if j == nil {
				continue
			}
			eff := effectivePriority(j.rec.Priority, j.rec.AgingFrom(), now, aging)
			if eff > bestEff || (eff == bestEff && waitedLonger(j, best)) {
				best, bestEff = j, eff
			}
		}
	}
	return best
}

// pop removes j, which best just returned.
func (q *readyQueue) pop(j *job) {
	h := &q.byType[j.rec.TaskType][j.rec.Priority.Level()]
	heap.Pop(h)
	j.queueGen++
	j.inQueue = false
	q.size--
}

// waitedLonger reports whether a began to wait before b (submission order among equals).
func waitedLonger(a, b *job) bool {
	if fa, fb := a.rec.AgingFrom(), b.rec.AgingFrom(); fa != fb {
		return fa < fb
	}
	return a.rec.Seq < b.rec.Seq
}

type seqHeap []queued

func (h seqHeap) Len() int { return len(h) }
func (h seqHeap) Less(a, b int) bool {
	if h[a].from != h[b].from {
		return h[a].from < h[b].from
	}
	return h[a].seq < h[b].seq
}
func (h seqHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *seqHeap) Push(x any)   { *h = append(*h, x.(queued)) }
func (h *seqHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = queued{}
	*h = old[:len(old)-1]
	return x
}

// head returns the first live entry's job, dropping stale entries on the way.
func (h *seqHeap) head() *job {
	for h.Len() > 0 {
		e := (*h)[0]
		if e.j.rec.State == protocol.StateQueued && e.j.queueGen == e.gen {
			return e.j
		}
		heap.Pop(h)
	}
	return nil
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
