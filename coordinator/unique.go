package coordinator

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Unique jobs. A submission may ask to be unique by its task type and payload (the
// payload compared as canonical JSON, as an idempotency key's fingerprint compares it):
//
//   - uniqueForMillis: no other job of the same type and payload is created until that
//     long after this one was, unless this one failed or was cancelled (River's
//     UniqueOpts.ByPeriod with its default states, Asynq's Unique(ttl)); a job that
//     completed within the window still holds it;
//   - uniqueWhile "active": none is created while this one is active (QUEUED,
//     SCHEDULED, WAITING, RUNNING or RETRY_WAIT).
//
// A submission that finds its key held is answered with the holder's id, as a repeat
// of an idempotency key is, and creates nothing. An idempotency key names one
// submission, whatever its content, and says that a repeat is the same request (a
// different content under the key is an error); a unique job names its content, and
// says that another request for the same work is not wanted while the first holds it.
//
// The holds live in the leader's memory, rebuilt by recovery from the records: an
// active job's record carries its unique key; a job that completed within its window is
// read whole at recovery, because its record's headers say so (HeaderUniqueUntil), and
// a checkpoint lists it as a job to read whole. A window lasts at most as long as the
// job is kept (Config.Retention): the holder's id must lead somewhere.

// uniqueIndex is which job holds each unique key. Guarded by the scheduler's mu.
type uniqueIndex struct {
	s     *scheduler
	holds map[string]uniqueHold
}

// uniqueHold is the job holding a key: its id and sequence, and the end of its
// window (Unix milliseconds; 0: while it is active).
type uniqueHold struct {
	id    string
	seq   uint64
	until int64
}

func newUniqueIndex(s *scheduler) *uniqueIndex {
	return &uniqueIndex{s: s, holds: make(map[string]uniqueHold)}
}

// uniqueWish is what a submission asks of uniqueness: its key, and its window
// (0: while active). An empty key asks nothing.
type uniqueWish struct {
	key  string
	for_ time.Duration
}

// uniqueOf reads a submission's uniqueness options; the error is the wire text.
func uniqueOf(req *protocol.SubmitJob) (uniqueWish, *protocol.Error) {
	forMillis, while := req.UniqueForMillis, req.UniqueWhile
	switch {
	case forMillis == 0 && while == "":
		return uniqueWish{}, nil
	case forMillis != 0 && while != "":
		return uniqueWish{}, &protocol.Error{Message: "Invalid uniqueness: give uniqueForMillis or uniqueWhile, not both"}
	case while != "" && while != protocol.UniqueWhileActive:
		return uniqueWish{}, &protocol.Error{Message: fmt.Sprintf("Invalid uniqueness: uniqueWhile must be %q, got %q", protocol.UniqueWhileActive, while)}
	case forMillis < 0 || time.Duration(forMillis)*time.Millisecond > protocol.MaxUniqueFor:
		return uniqueWish{}, &protocol.Error{Message: fmt.Sprintf("Invalid uniqueness: uniqueForMillis must be in [1, %d], got %d", protocol.MaxUniqueFor.Milliseconds(), forMillis)}
	}
	key, err := uniqueKey(req.TaskType, req.Payload)
	if err != nil {
		return uniqueWish{}, protocol.InvalidPayload(err.Error())
	}
	return uniqueWish{key: key, for_: time.Duration(forMillis) * time.Millisecond}, nil
}

// uniqueKey is the digest of a task type and a payload in canonical JSON.
func uniqueKey(taskType string, payload json.RawMessage) (string, error) {
	canon, err := canonicalJSON(payload)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "unique\x00%s\x00%s", taskType, canon)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// holder returns the id of the job holding key at now, and the job itself while the
// scheduler holds it in memory; "" if none does. A hold found ended is forgotten.
func (u *uniqueIndex) holder(key string, now time.Time) (string, *job) {
	h, ok := u.holds[key]
	if !ok {
		return "", nil
	}
	if j := u.s.jobs[h.id]; j != nil {
		if j.rec.UniqueKey == key && holds(j.rec.State, h.until, now) {
			return h.id, j
		}
	} else if e := u.s.kept.index.find(h.seq); e != nil && u.s.kept.index.hasID(e, h.id) && holds(e.state(), h.until, now) {
		return h.id, nil
	}
	delete(u.holds, key)
	return "", nil
}

// holds reports whether a job in state st, whose window ends at until (0: none, it is
// unique while active), holds its key at now: within its window unless it FAILED or
// was CANCELLED, whether still active or COMPLETED; without one, while active.
func holds(st protocol.State, until int64, now time.Time) bool {
	if until == 0 {
		return !st.Terminal()
	}
	return (!st.Terminal() || st == protocol.StateCompleted) && until > now.UnixMilli()
}

// hold makes j, just created, unique as w asks (if it asks): its record carries the
// key and the window's end, and it holds the key.
func (u *uniqueIndex) hold(j *job, w uniqueWish) {
	if w.key == "" {
		return
	}
	j.rec.UniqueKey = w.key
	if w.for_ > 0 {
		j.rec.UniqueUntil = j.rec.CreatedAt + w.for_.Milliseconds()
	}
	u.holds[w.key] = uniqueHold{id: j.rec.JobID, seq: j.rec.Seq, until: j.rec.UniqueUntil}
}

// answerUnique answers a submission whose unique key is held with the holder's id
// (once the holder is durable, as answerDuplicate does), and reports whether it did.
// Called with the scheduler's mu held.
func (s *scheduler) answerUnique(key string, due time.Duration, reply replyFunc) bool {
	id, j := s.uniq.holder(key, s.now())
	if id == "" {
		return false
	}
	s.note.submitted(SubmitDuplicate)
	s.answerWhenCreated(id, j, due, reply)
	return true
}

// retired is told of a finished job whose record is durable: its hold ends now, or
// when its window does.
func (u *uniqueIndex) retired(j *job) {
	key := j.rec.UniqueKey
	if key == "" || u.holds[key].id != j.rec.JobID {
		return
	}
	if !holds(j.rec.State, j.rec.UniqueUntil, u.s.now()) {
		delete(u.holds, key)
		return
	}
	u.expireAt(key, j.rec.JobID, j.rec.UniqueUntil)
}

// expireAt forgets the hold of key by id once its window ends.
func (u *uniqueIndex) expireAt(key, id string, until int64) {
	u.s.timers.call(time.UnixMilli(until), func(now time.Time) {
		if h, ok := u.holds[key]; ok && h.id == id && h.until <= now.UnixMilli() {
			delete(u.holds, key)
		}
	})
}

// restored is told of a record recovery read whole: an active job holds its key; a
// finished one within its window holds it until the window ends. A finished record read
// whole only for its window (a checkpoint lists it so: readWhole) gets its idempotency
// binding back here, which the checkpoint's entry would have carried.
func (u *uniqueIndex) restored(r *protocol.Record) {
	if r.UniqueKey == "" {
		return
	}
	now := u.s.now()
	if !holds(r.State, r.UniqueUntil, now) {
		return
	}
	if h, ok := u.holds[r.UniqueKey]; ok && h.seq > r.Seq {
		return // a later job holds it (one of the two had ended)
	}
	u.holds[r.UniqueKey] = uniqueHold{id: r.JobID, seq: r.Seq, until: r.UniqueUntil}
	if !r.State.Terminal() {
		return
	}
	u.expireAt(r.UniqueKey, r.JobID, r.UniqueUntil)
	if k := r.IdempotencyKey; k != "" {
		if e := u.s.kept.index.find(r.Seq); e != nil && u.s.kept.index.hasID(e, r.JobID) {
			u.s.kept.index.setKey(e, k)
			u.s.kept.doneKeys[k] = doneKey{jobID: r.JobID, fingerprint: r.Fingerprint}
		}
	}
}

// readWhole marks, in a checkpoint's heads (sorted by sequence), the jobs out of memory
// that hold a key as jobs to read whole, so that the recovery reading the checkpoint
// learns their keys: finished ones within their window, and SCHEDULED ones due beyond
// the schedule window (delayed.go), which recovery would otherwise know by their heads.
func (u *uniqueIndex) readWhole(hs []head) {
	now := u.s.now()
	for _, h := range u.holds {
		if u.s.jobs[h.id] != nil {
			continue // in memory: read whole anyway
		}
		i := sort.Search(len(hs), func(i int) bool { return hs[i].seq >= h.seq })
		if i >= len(hs) || hs[i].seq != h.seq {
			continue
		}
		if st := hs[i].state; st == protocol.StateScheduled || st == protocol.StateCompleted && h.until > now.UnixMilli() {
			hs[i] = head{seq: h.seq, id: hs[i].id}
		}
	}
}

// wholeHead is h as a head whose record recovery reads whole: a finished one that
// holds a unique window, or a SCHEDULED one that holds a key, is restored from its
// record, not from its head, once.
func wholeHead(h head) head {
	if h.state.Terminal() || h.state == protocol.StateScheduled {
		return head{id: h.id, seq: h.seq}
	}
	return h
}

// heldUntil is what a record's headers say of the unique key it holds, so that
// recovery, which knows finished and far SCHEDULED jobs by their headers only, reads
// the record whole: while COMPLETED within its window, the window's end; while
// SCHEDULED, its due time (it holds the key at least until then); else 0.
func heldUntil(r *protocol.Record) int64 {
	if r.UniqueKey == "" {
		return 0
	}
	switch r.State {
	case protocol.StateCompleted:
		return r.UniqueUntil
	case protocol.StateScheduled:
		return r.RunAt
	}
	return 0
}
