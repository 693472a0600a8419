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
// record is durable (j nil). A million finished jobs are a million entries, which the
// garbage collector walks on every cycle: an entry holds its id in 16 bytes rather
// than as a string, its state as a code, its rare parts (a long id that is no UUID, an
// idempotency key, a far SCHEDULED job's queue other than the default) in jobIndex's
// maps, so that a finished job's entry has no pointer the collector must follow (its
// j and snap are nil).
type entry struct {
	seq   uint64
	id    [16]byte      // the job id: see idn
	idn   byte          // 0: id is a canonical UUID's bytes (uuid); 1-16: the id, this long; oddID
	code  byte          // the state's checkpoint code (codeState); 0 once removed
	keyed bool          // a finished job's idempotency key is in jobIndex.keys
	named bool          // a far SCHEDULED job's queue, not the default, is in jobIndex.queues
	j     *job          // while active, or until its final record is durable
	snap  *protocol.Job // of one of the recentFinished last jobs to finish
}

// oddID is the idn of an id longer than 16 bytes that is no canonical UUID: it is in
// jobIndex.odd.
const oddID = 255

// live reports whether the entry holds a job (removed ones leave a hole).
func (e *entry) live() bool { return e.code != 0 }

// state is the job's state as the entry knows it: a finished job's; an active job's
// is its record's.
func (e *entry) state() protocol.State { return codeState[e.code] }

func (e *entry) setState(st protocol.State) { e.code = stateCode[st] }

// uuid is a job id in the canonical form newID writes (36 characters: lower-case hex
// digits and four dashes), as 16 bytes.
type uuid [16]byte

// parseUUID reads id when it is in exactly the form String writes back.
func parseUUID(id string) (u uuid, ok bool) {
	if len(id) != 36 || id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
		return u, false
	}
	for k, i := range uuidDigits {
		hi, ok1 := fromHex(id[i])
		lo, ok2 := fromHex(id[i+1])
		if !ok1 || !ok2 {
			return u, false
		}
		u[k] = hi<<4 | lo
	}
	return u, true
}

// uuidDigits are where each byte's two hex digits start in a canonical UUID.
var uuidDigits = [16]int{0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34}

func fromHex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// appendTo appends the id's canonical form.
func (u uuid) appendTo(b []byte) []byte {
	const hex = "0123456789abcdef"
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hex[c>>4], hex[c&0xF])
	}
	return b
}

func (u uuid) String() string {
	var buf [36]byte
	return string(u.appendTo(buf[:0]))
}

// recentFinished is how many of the last finished jobs keep their snapshot in memory:
// lists show the newest jobs first, so most pages need no read from KV.
const recentFinished = 4096

// jobIndex is every job this coordinator keeps, by sequence. Removed entries leave a
// hole until the holes are many, so removing costs O(1) amortised.
type jobIndex struct {
	entries []entry
	holes   int
	odd     map[uint64]string // the oddID ids, by sequence
	keys    map[uint64]string // finished jobs' idempotency keys, by sequence
	queues  map[uint64]string // far SCHEDULED jobs' queues but the default, by sequence (delayed.go)
	done    []int             // live entries without a job (finished ones), by state code
}

// add appends a job with a sequence above all others (a new submission), or, during
// recovery, anywhere (sort follows). key is a finished job's idempotency key.
func (x *jobIndex) add(seq uint64, id string, st protocol.State, key string, j *job) {
	e := entry{seq: seq, j: j}
	e.setState(st)
	if u, ok := parseUUID(id); ok {
		e.id = u
	} else if len(id) <= len(e.id) {
		e.idn = byte(copy(e.id[:], id))
	} else {
		e.idn = oddID
		if x.odd == nil {
			x.odd = make(map[uint64]string)
		}
		x.odd[seq] = id
	}
	x.entries = append(x.entries, e)
	x.setKey(&x.entries[len(x.entries)-1], key)
	x.countDone(&e, 1)
}

// countDone adds d to the count of e's state if e is a finished job's entry (live, no
// job), which jobCounts reads instead of walking every entry.
func (x *jobIndex) countDone(e *entry, d int) {
	if e.j != nil || !e.live() {
		return
	}
	for int(e.code) >= len(x.done) {
		x.done = append(x.done, 0)
	}
	x.done[e.code] += d
}

// id is the entry's job id.
func (x *jobIndex) id(e *entry) string {
	switch e.idn {
	case 0:
		return uuid(e.id).String()
	case oddID:
		return x.odd[e.seq]
	}
	return string(e.id[:e.idn])
}

// appendID appends the entry's job id to b.
func (x *jobIndex) appendID(b []byte, e *entry) []byte {
	switch e.idn {
	case 0:
		return uuid(e.id).appendTo(b)
	case oddID:
		return append(b, x.odd[e.seq]...)
	}
	return append(b, e.id[:e.idn]...)
}

// hasID reports whether the entry is of job id, without making its id a string.
func (x *jobIndex) hasID(e *entry, id string) bool {
	switch e.idn {
	case 0:
		u, ok := parseUUID(id)
		return ok && u == e.id
	case oddID:
		return x.odd[e.seq] == id
	}
	return string(e.id[:e.idn]) == id
}

// key is a finished job's idempotency key, "" if it has none.
func (x *jobIndex) key(e *entry) string {
	if !e.keyed {
		return ""
	}
	return x.keys[e.seq]
}

// setKey sets a finished job's idempotency key ("": none).
func (x *jobIndex) setKey(e *entry, k string) {
	switch {
	case k != "":
		if x.keys == nil {
			x.keys = make(map[uint64]string)
		}
		x.keys[e.seq], e.keyed = k, true
	case e.keyed:
		delete(x.keys, e.seq)
		e.keyed = false
	}
}

// queue is a far SCHEDULED job's queue (delayed.go's chill): DefaultQueue unless named.
func (x *jobIndex) queue(e *entry) string {
	if !e.named {
		return protocol.DefaultQueue
	}
	return x.queues[e.seq]
}

// setQueue sets a far SCHEDULED job's queue ("" or DefaultQueue: none kept).
func (x *jobIndex) setQueue(e *entry, q string) {
	switch {
	case q != "" && q != protocol.DefaultQueue:
		if x.queues == nil {
			x.queues = make(map[uint64]string)
		}
		x.queues[e.seq], e.named = q, true
	case e.named:
		delete(x.queues, e.seq)
		e.named = false
	}
}

// sort orders the entries by sequence, once recovery has added them.
func (x *jobIndex) sort() {
	slices.SortFunc(x.entries, func(a, b entry) int { return cmp.Compare(a.seq, b.seq) })
}

// find returns the live entry of seq, or nil.
func (x *jobIndex) find(seq uint64) *entry {
	i := sort.Search(len(x.entries), func(i int) bool { return x.entries[i].seq >= seq })
	if i < len(x.entries) && x.entries[i].seq == seq && x.entries[i].live() {
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
	if e.idn == oddID {
		delete(x.odd, seq)
	}
	x.setKey(e, "")
	x.setQueue(e, "")
	x.countDone(e, -1)
	*e = entry{seq: seq}
	x.holes++
	if x.holes > 1024 && x.holes > len(x.entries)/2 {
		x.entries = slices.DeleteFunc(x.entries, func(e entry) bool { return !e.live() })
		x.holes = 0
	}
}

// retention is every job the coordinator keeps, by sequence (index): an active one by
// its entry and job, a finished one by its entry alone, with its idempotency key's
// binding (doneKeys), until its retention ends (expiring, in order from expHead; the
// sweeper's expire forgets it), and the snapshots of the jobs that finished last
// (recent). Guarded by the scheduler's mu, like the jobs it indexes.
type retention struct {
	s   *scheduler
	cfg *Config

	index      jobIndex           // every kept job by sequence
	doneKeys   map[string]doneKey // idempotency keys of finished jobs, until they expire
	expiring   []expiring         // finished jobs by the end of their retention, from expHead
	expHead    int
	recent     []uint64 // sequences of the jobs that finished last
	recentNext int
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

// retire keeps a finished job whose record is durable, and which the scheduler no
// longer holds, by its entry only, and its key's binding, until its retention ends.
func (rt *retention) retire(j *job) {
	r := &j.rec
	if e := rt.index.find(r.Seq); e != nil && e.j == j {
		snap := j.snapshot()
		e.j, e.snap = nil, &snap
		e.setState(r.State)
		rt.index.countDone(e, 1)
		rt.index.setKey(e, r.IdempotencyKey)
		rt.remember(r.Seq)
	}
	if k := r.IdempotencyKey; k != "" {
		rt.doneKeys[k] = doneKey{jobID: r.JobID, fingerprint: r.Fingerprint}
	}
	rt.expireAt(r.Seq, time.UnixMilli(r.EndedAt))
}

// remember keeps seq among the recently finished jobs whose snapshots stay in memory,
// forgetting the snapshot of the oldest. Called with the scheduler's mu held.
func (rt *retention) remember(seq uint64) {
	if len(rt.recent) < recentFinished {
		rt.recent = append(rt.recent, seq)
		return
	}
	if e := rt.index.find(rt.recent[rt.recentNext]); e != nil && e.j == nil {
		e.snap = nil
	}
	rt.recent[rt.recentNext] = seq
	rt.recentNext = (rt.recentNext + 1) % recentFinished
}

// expireAt schedules a finished job's removal from memory when its retention ends.
// Called with the scheduler's mu held.
func (rt *retention) expireAt(seq uint64, ended time.Time) {
	if rt.cfg.Retention == 0 {
		return
	}
	at := ended.Add(rt.cfg.Retention).UnixMilli()
	// Jobs retire in the order they end, so the queue stays sorted; a clock step
	// back must not break that.
	if n := len(rt.expiring); n > 0 {
		at = max(at, rt.expiring[n-1].at)
	}
	rt.expiring = append(rt.expiring, expiring{at: at, seq: seq})
}

// expire forgets the finished jobs whose retention has ended: JetStream removes their
// records by itself. Called with the scheduler's mu held.
func (rt *retention) expire(now time.Time) {
	for rt.expHead < len(rt.expiring) && rt.expiring[rt.expHead].at <= now.UnixMilli() {
		x := rt.expiring[rt.expHead]
		rt.expiring[rt.expHead] = expiring{}
		rt.expHead++
		if e := rt.index.find(x.seq); e != nil && e.j == nil {
			if k := rt.index.key(e); k != "" {
				if d, ok := rt.doneKeys[k]; ok && rt.index.hasID(e, d.jobID) {
					delete(rt.doneKeys, k)
				}
			}
			rt.index.remove(x.seq)
		}
	}
	if rt.expHead > 1024 && rt.expHead > len(rt.expiring)/2 {
		rt.expiring = slices.Clone(rt.expiring[rt.expHead:])
		rt.expHead = 0
	}
}
