package coordinator

import (
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// recordMessage is a job record's message to the JOBS stream, allocated at once with
// the backing of its header values and the one-element slice messages returns. Its
// subject and header values are parts of one string: building a record's message took
// 10 to 13 allocations (nats.NewMsg, a []string per Header.Set, each number's string),
// and takes 3 to 4.
type recordMessage struct {
	m    nats.Msg
	one  [1]*nats.Msg
	vals [8]string // at most 7 headers: a finished record has no run time or queue, an active one no TTL
}

// buildRecordMsg builds w's record message in r: its headers say the job's sequence
// and state, the revision it replaces (a CAS) or, for a create, the term it is fenced
// by, and for a finished job its TTL and when its retention ends, for a COMPLETED job
// that holds a unique window when the window ends (for a SCHEDULED one that holds a
// unique key, when it is due), and for a SCHEDULED job when it is due and its queue. It
// returns reply as a part of the one string the message's subject and header values
// are parts of: a pipelined write's reply subject (pipeline.send), without an
// allocation of its own.
func (s *jsStore) buildRecordMsg(r *recordMessage, w *pendingWrite, reply []byte) (replySubject string) {
	r.one[0] = &r.m
	var buf [256]byte
	b := append(buf[:0], jobsSubjects...)
	b = append(b, w.id...)
	var ends [6]int // of the subject, then each number after it
	ends[0] = len(b)
	b = strconv.AppendUint(b, w.seq, 10)
	ends[1] = len(b)
	expect := w.rev
	if w.rev == 0 {
		expect = s.termSeq
	}
	b = strconv.AppendUint(b, expect, 10)
	ends[2] = len(b)
	if w.ttl > 0 {
		b = strconv.AppendInt(b, w.expires, 10)
	}
	ends[3] = len(b)
	if w.uniqueUntil > 0 || w.state == protocol.StateScheduled {
		b = strconv.AppendInt(b, w.uniqueUntil, 10)
	}
	ends[4] = len(b)
	if w.runAt != 0 {
		b = strconv.AppendInt(b, w.runAt, 10)
	}
	ends[5] = len(b)
	b = append(b, reply...)
	all := string(b)
	part := func(i int) string { return all[ends[i-1]:ends[i]] }

	n := 0
	h := make(nats.Header, 8)
	set := func(key, v string) {
		r.vals[n] = v
		h[key] = r.vals[n : n+1 : n+1]
		n++
	}
	set(protocol.HeaderSeq, part(1))
	set(protocol.HeaderState, string(w.state))
	set(jetstream.ExpectedLastSubjSeqHeader, part(2))
	if w.rev == 0 {
		set(jetstream.ExpectedLastSubjSeqSubjHeader, termSubject)
	}
	if w.ttl > 0 {
		set(jetstream.MsgTTLHeader, s.ttlText(w.ttl))
		set(protocol.HeaderExpires, part(3))
	}
	// A COMPLETED or SCHEDULED job holding a unique key (unique.go); a SCHEDULED one
	// holding none says 0, so that recovery tells it from the record of a release
	// before the header, which it must read whole (readHead).
	if w.uniqueUntil > 0 || w.state == protocol.StateScheduled {
		set(protocol.HeaderUniqueUntil, part(4))
	}
	if w.runAt != 0 { // a SCHEDULED job's due time (delayed.go)
		set(protocol.HeaderRunAt, part(5))
	}
	if w.queue != "" { // and its queue, which recovery counts as holding a job (queue.go)
		set(protocol.HeaderQueue, w.queue)
	}
	r.m = nats.Msg{Subject: all[:ends[0]], Data: w.data, Header: h}
	return all[ends[5]:]
}

// RecordMessage is the message by which a coordinator with the given retention stores
// r, a job's record: its subject, data and headers as the coordinator's own write of it
// has them (its sequence and state, a finished record's TTL and retention end, a
// SCHEDULED record's due time, queue and unique window), less the fencing only a
// leader's write carries. It is for tools that fill a store directly
// (internal/cmd/fillstore): recovery reads what they write as the coordinator's own
// records, and takes the same path through them (a record without a header the
// coordinator writes is taken for one of an older release, and may be read whole).
// An idempotency key of r is not bound.
func RecordMessage(r *protocol.Record, retention time.Duration) (*nats.Msg, error) {
	data, err := r.AppendJSON(nil)
	if err != nil {
		return nil, fmt.Errorf("encode job %s: %w", r.JobID, err)
	}
	w := pendingWrite{id: r.JobID, data: data, seq: r.Seq, state: r.State,
		ttl:     recordTTL(retention, time.Now(), r.EndedAt),
		expires: time.UnixMilli(r.EndedAt).Add(retention).UnixMilli(),
		runAt:   scheduledAt(r), queue: scheduledIn(r), uniqueUntil: heldUntil(r)}
	var s jsStore
	var m recordMessage
	s.buildRecordMsg(&m, &w, nil)
	m.m.Header.Del(jetstream.ExpectedLastSubjSeqHeader)
	m.m.Header.Del(jetstream.ExpectedLastSubjSeqSubjHeader)
	return &m.m, nil
}

// ttlText is d's Nats-TTL header value (d.String()), remembered for the last d: every
// finished job's TTL is the retention.
func (s *jsStore) ttlText(d time.Duration) string {
	if t := s.lastTTL.Load(); t != nil && t.d == d {
		return t.text
	}
	t := &ttlString{d: d, text: d.String()}
	s.lastTTL.Store(t)
	return t.text
}

// ttlString is a TTL and its header value.
type ttlString struct {
	d    time.Duration
	text string
}
