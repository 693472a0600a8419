package coordinator

import (
	"cmp"
	"slices"
	"sort"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Memory holds what scheduling needs: active jobs whole, and of each finished job only
// what lists order and filter on (an entry) and, for a job with an idempotency key, the
// binding (doneKey). A finished job's record is read from KV when asked for. Both go
// when the job's retention ends, as its record does in KV.

// entry is one job in submission order: an active one (j set), or a finished one whose
// record is durable (j nil).
type entry struct {
	seq   uint64
	id    string // "" once removed
	state protocol.State
	key   string        // a finished job's idempotency key
	j     *job          // while active, or until its final record is durable
	snap  *protocol.Job // of one of the recentFinished last jobs to finish
}

// recentFinished is how many of the last finished jobs keep their snapshot in memory:
// lists show the newest jobs first, so most pages need no read from KV.
const recentFinished = 4096

// jobIndex is every job this coordinator keeps, by sequence. Removed entries leave a
// hole until the holes are many, so removing costs O(1) amortised.
type jobIndex struct {
	entries []entry
	holes   int
}

// add appends a job with a sequence above all others (a new submission), or, during
// recovery, anywhere (sort follows).
func (x *jobIndex) add(e entry) { x.entries = append(x.entries, e) }

// sort orders the entries by sequence, once recovery has added them.
func (x *jobIndex) sort() {
	slices.SortFunc(x.entries, func(a, b entry) int { return cmp.Compare(a.seq, b.seq) })
}

// find returns the live entry of seq, or nil.
func (x *jobIndex) find(seq uint64) *entry {
	i := sort.Search(len(x.entries), func(i int) bool { return x.entries[i].seq >= seq })
	if i < len(x.entries) && x.entries[i].seq == seq && x.entries[i].id != "" {
		return &x.entries[i]
	}
	return nil
}

// below is the index after the last entry with a sequence below seq: a walk newest
// first starts there.
func (x *jobIndex) below(seq uint64) int {
	return sort.Search(len(x.entries), func(i int) bool { return x.entries[i].seq >= seq })
}

// remove drops the entry of seq.
func (x *jobIndex) remove(seq uint64) {
	e := x.find(seq)
	if e == nil {
		return
	}
	*e = entry{seq: seq}
	x.holes++
	if x.holes > 1024 && x.holes > len(x.entries)/2 {
		x.entries = slices.DeleteFunc(x.entries, func(e entry) bool { return e.id == "" })
		x.holes = 0
	}
}

// doneKey is the binding of a finished job's idempotency key.
type doneKey struct {
	jobID, fingerprint string
}

// expiring is a finished job whose retention ends at at (Unix milliseconds).
type expiring struct {
	at  int64
	seq uint64
}

// retire moves a finished job whose record is durable out of memory: only its entry,
// and its key's binding, stay until its retention ends. Called with c.mu held.
func (c *Coordinator) retire(j *job) {
	r := &j.rec
	delete(c.jobs, r.JobID)
	if e := c.index.find(r.Seq); e != nil && e.j == j {
		snap := j.snapshot()
		e.j, e.state, e.key, e.snap = nil, r.State, r.IdempotencyKey, &snap
		c.remember(r.Seq)
	}
	if k := r.IdempotencyKey; k != "" {
		if c.keys[k] == j {
			delete(c.keys, k)
		}
		c.doneKeys[k] = doneKey{jobID: r.JobID, fingerprint: r.Fingerprint}
	}
	c.expireAt(r.Seq, time.UnixMilli(r.EndedAt))
}

// remember keeps seq among the recently finished jobs whose snapshots stay in memory,
// forgetting the snapshot of the oldest. Called with c.mu held.
func (c *Coordinator) remember(seq uint64) {
	if len(c.recent) < recentFinished {
		c.recent = append(c.recent, seq)
		return
	}
	if e := c.index.find(c.recent[c.recentNext]); e != nil && e.j == nil {
		e.snap = nil
	}
	c.recent[c.recentNext] = seq
	c.recentNext = (c.recentNext + 1) % recentFinished
}

// expireAt schedules a finished job's removal from memory when its retention ends.
// Called with c.mu held.
func (c *Coordinator) expireAt(seq uint64, ended time.Time) {
	if c.cfg.Retention == 0 {
		return
	}
	at := ended.Add(c.cfg.Retention).UnixMilli()
	// Jobs retire in the order they end, so the queue stays sorted; a clock step
	// back must not break that.
	if n := len(c.expiring); n > 0 {
		at = max(at, c.expiring[n-1].at)
	}
	c.expiring = append(c.expiring, expiring{at: at, seq: seq})
}

// expire forgets the finished jobs whose retention has ended: JetStream removes their
// records by itself. Called with c.mu held.
func (c *Coordinator) expire(now time.Time) {
	for c.expHead < len(c.expiring) && c.expiring[c.expHead].at <= now.UnixMilli() {
		x := c.expiring[c.expHead]
		c.expiring[c.expHead] = expiring{}
		c.expHead++
		if e := c.index.find(x.seq); e != nil && e.j == nil {
			if d, ok := c.doneKeys[e.key]; ok && e.key != "" && d.jobID == e.id {
				delete(c.doneKeys, e.key)
			}
			c.index.remove(x.seq)
		}
	}
	if c.expHead > 1024 && c.expHead > len(c.expiring)/2 {
		c.expiring = slices.Clone(c.expiring[c.expHead:])
		c.expHead = 0
	}
}
