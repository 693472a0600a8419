package coordinator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// An answer means what it says (DESIGN invariant 8): JOB_SUBMITTED, JOB_CANCEL and a
// result's acknowledgement go once their write is stored; an ERROR or a SUBMIT_REJECTED
// only when nothing was stored; and a request whose write is neither confirmed nor ruled
// out when its reply is due hears "Outcome unknown" (protocol.OutcomeUnknown), never
// "not stored".
//
// A write's outcome is unknown when it was sent and no answer says what became of it: a
// timeout, a lost connection, a stream whose leader died with the write in flight (its
// successor may commit it), the coordinator stopping mid-write. Such a write is marked
// uncertain (job.uncertain) until one of its copies is acknowledged or the store shows
// it absent for good. While the coordinator runs, an uncertain create is written again
// until it lands (the copy is the same record, so a second landing changes nothing),
// and an update whose retry meets a revision moved past it is read back (readBack):
// when what is stored is its own earlier copy, the write succeeded, and the coordinator
// goes on instead of fencing itself; when the store cannot be read, it writes again
// until a read tells. When the coordinator stops writing a job (fenced,
// closing), the store is read back once before its waiters hear anything.
//
// The parts: the store (jsStore) knows which writes went unanswered and reads back
// (readAt); the scheduler keeps each job's uncertainty (job.uncertain, under its mu)
// and its submission's pending answer (job.answer), and hears the store through its
// sink (doubt, inDoubt, settle, hurry); the api answers within the request's wait
// (replyDue); the store's health remembers why writes fail (storage.go, diagnose.go).

// ErrOutcomeUnknown means a write was sent and it is not known whether it was stored: the
// request's answer says "Outcome unknown".
var ErrOutcomeUnknown = errors.New("outcome unknown: the write may or may not be stored")

// unknownOutcome wraps why a write's outcome is unknown.
func unknownOutcome(cause error) error { return fmt.Errorf("%w: %w", ErrOutcomeUnknown, cause) }

// refusedOutright reports a failed write whose copy certainly stored nothing:
// JetStream answered it with an error (a revision or term check, a limit), no server
// took it (no responders), or it could not be sent at all. Anything else may have been
// stored.
func refusedOutright(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) || errors.Is(err, ErrFenced) || permanent(err) || noResponders(err)
}

// pendingEarlier reports a copy refused because a write of the same subject is still
// being committed: JetStream's "wrong last sequence" without a sequence (code 10164).
// A cluster's stream leader answers so while an earlier write checked against that
// subject is in its log and not yet in its store, where a read does not see it; it
// keeps proposing without a quorum, and the write commits once a follower is back. So
// the store showing nothing does not mean that an earlier copy of the write cannot
// land, nor that someone else wrote the record.
func pendingEarlier(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// --- The store's half: what became of a write (jsStore).

// writeOutcomes is the jsStore's part that learns what became of writes whose outcome
// is unknown: it marks them in doubt with the sink, reads the store back (readAt) and
// ends their waiters with what is stored.
type writeOutcomes struct{ s *jsStore }

// note records what a failed write of ws says about their jobs: a write that may
// have been stored makes its job uncertain. Success clears it (written).
func (o writeOutcomes) note(ws []pendingWrite, err error) {
	if err == nil || refusedOutright(err) {
		return
	}
	o.s.sink.doubts().doubt(ws)
}

// readBackTimeout bounds one read-back of the store.
const readBackTimeout = 2 * time.Second

// landing is what a read-back found of a write.
type landing int

const (
	landingUnknown landing = iota // the store could not be read
	landed                        // the write's last message is what the store holds
	notLanded                     // the store holds something else, or nothing
)

// readBack reads what the store holds under the record the last of ws writes, from the
// stream's leader (readAt), and compares it with that write: ws went in one atomic
// batch, or are one write, so the last message stands for all. On landed, revs are the
// revisions each of ws was stored at.
func (o writeOutcomes) readBack(ctx context.Context, ws []pendingWrite) (landing, []uint64) {
	last := &ws[len(ws)-1]
	rctx, cancel := context.WithTimeout(ctx, readBackTimeout)
	defer cancel()
	data, seq, err := o.s.readAt(rctx, last.id)
	switch {
	case errors.Is(err, errNoRecord):
		return notLanded, nil
	case err != nil:
		o.s.log.Warn("could not read a job back to learn whether its write was stored", "job", last.id, "err", err)
		return landingUnknown, nil
	case !bytes.Equal(data, last.data):
		return notLanded, nil
	}
	// The batch's messages were stored one after the other, the last at seq.
	n := 0
	for i := range ws {
		n += ws[i].messageCount()
	}
	revs := make([]uint64, len(ws))
	at := seq - uint64(n)
	for i := range ws {
		at += uint64(ws[i].messageCount())
		revs[i] = at
	}
	return landed, revs
}

// abandon stops writing ws, which failed with err and go no further: the coordinator is
// fenced or stopping, or the write cannot be made. Their waiters hear what is stored: a
// write that may have landed earlier is read back first; one that did is recorded as
// stored; one that the store shows absent after a refused copy (or that never went)
// fails with err; and one that cannot be known fails with ErrOutcomeUnknown. batch says
// ws went as one atomic batch (one read stands for all); otherwise each is read.
func (o writeOutcomes) abandon(ws []pendingWrite, batch bool, err error) {
	doubt := o.s.sink.doubts().inDoubt(ws)
	if len(doubt) == 0 {
		o.failAll(ws, err)
		return
	}
	o.failAll(without(ws, doubt), err)
	groups := [][]pendingWrite{doubt}
	if !batch {
		groups = groups[:0]
		for i := range doubt {
			groups = append(groups, doubt[i:i+1])
		}
	}
	// One deadline for all: a stopping coordinator waits for this, not per write.
	ctx, cancel := context.WithTimeout(context.Background(), readBackTimeout)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, g := range groups {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			o.settleAbandoned(ctx, g, err)
		}()
	}
	wg.Wait()
}

// settleAbandoned reads back one group of abandoned writes and ends their waiters.
func (o writeOutcomes) settleAbandoned(ctx context.Context, ws []pendingWrite, err error) {
	switch l, revs := o.readBack(ctx, ws); {
	case l == landed:
		o.s.log.Info("a job write whose outcome was unknown was stored after all", "jobs", len(ws), "job", ws[0].id)
		for i, w := range ws {
			o.s.sink.written(w.j, revs[i], w.version)
		}
	case l == notLanded && refusedOutright(err) && !pendingEarlier(err):
		o.s.sink.doubts().settle(ws)
		o.failAll(ws, err)
	default:
		o.failAll(ws, unknownOutcome(err))
	}
}

// failAll ends the waiters of ws with err; a create that certainly was not
// stored is forgotten, as if never submitted.
func (o writeOutcomes) failAll(ws []pendingWrite, err error) {
	for _, w := range ws {
		if w.rev == 0 && !errors.Is(err, ErrOutcomeUnknown) {
			o.s.sink.giveUp(w.j, err)
		} else {
			o.s.sink.fail(w.j, err)
		}
	}
}

// without is ws less those in drop (by job).
func without(ws, drop []pendingWrite) []pendingWrite {
	gone := make(map[*job]bool, len(drop))
	for _, w := range drop {
		gone[w.j] = true
	}
	var kept []pendingWrite
	for _, w := range ws {
		if !gone[w.j] {
			kept = append(kept, w)
		}
	}
	return kept
}

// landedEarlier handles a copy of ws refused outright (err) after an earlier copy's
// outcome was unknown: when the store holds the earlier copy, the write succeeded and
// its revisions are returned with a nil error; when it holds none, nothing earlier can
// land any more, and the refusal stands, unless the refusal says a write is still being
// committed (pendingEarlier): then the earlier copy's outcome stays unknown. When the
// store cannot be read, a record that moved may have been moved by the earlier copy: the
// outcome is unknown, and the write is tried again rather than fence the coordinator
// (a newer term still fences: refused, batch.go).
func (o writeOutcomes) landedEarlier(ctx context.Context, ws []pendingWrite, err error) ([]uint64, error) {
	if !refusedOutright(err) || len(o.s.sink.doubts().inDoubt(ws)) == 0 {
		return nil, err
	}
	switch l, revs := o.readBack(ctx, ws); {
	case l == landed:
		o.s.log.Info("a job write whose outcome was unknown had been stored; going on from it", "jobs", len(ws), "job", ws[0].id)
		return revs, nil
	case l == notLanded && !pendingEarlier(err):
		o.s.sink.doubts().settle(ws)
	case l == landingUnknown && errors.Is(err, errRecordMoved):
		return nil, fmt.Errorf("%w: %w; it could not be read back to tell whether this write's earlier copy moved it", ErrOutcomeUnknown, errRecordMoved)
	}
	return nil, err
}

// hurry has the submitters of the uncertain creates among ws answered "Outcome
// unknown" now, with the store's fault (err, from storeFailure), rather than when their
// replies are due: a full or read-only disk outlasts a request. Their writes go on,
// and a job whose write lands later runs.
func (o writeOutcomes) hurry(ws []pendingWrite, err error) {
	if len(ws) > 0 {
		o.s.sink.doubts().hurry(ws, storeCause(err))
	}
}

// slowWriteAfter is how long a write goes unacknowledged before the jobs stream is
// asked why (slowWrite): a healthy one acknowledges in milliseconds.
const slowWriteAfter = time.Second

// slowWrite has the store asked, once at a time, why a write sent age ago is not
// acknowledged yet, for the answers due next (unconfirmed). A store that cannot be
// asked (memStore) is not.
func (h *storeHealth) slowWrite(age time.Duration) {
	f := h.slow.Load()
	if f == nil || h.recentCause(age) != nil || !h.diagnosing.CompareAndSwap(false, true) {
		return
	}
	(*f)(age)
}

// diagnoseSlowWrite asks the jobs stream why a write sent due ago is not confirmed,
// and remembers it for the answers due next. A settled leader that answers is not
// taken for a stalled disk here: the write may only be slow. It runs on a goroutine of
// the store's (slowWrite, set by open) and ends the diagnosis in progress.
func (s *jsStore) diagnoseSlowWrite(due time.Duration) {
	defer s.storage.diagnosing.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), readBackTimeout)
	defer cancel()
	d := diagnoseStream(ctx, s.nc, s.js, jobsStream, context.DeadlineExceeded, time.Now().Add(-due))
	if d.cond == condStalled {
		d = diagnosis{cond: condUnanswered, stream: jobsStream, detail: "stream " + jobsStream + "'s leader answers, and has not confirmed it yet"}
	}
	s.storage.noteCause(d)
}

// --- The scheduler's half: each job's uncertainty and its request's one answer.

// doubts is the writeQueue, which keeps which jobs' writes are in doubt (storeSink).
func (s *scheduler) doubts() writeDoubts { return s.wq }

// doubt marks the jobs of ws as having a write whose outcome is unknown.
func (q *writeQueue) doubt(ws []pendingWrite) {
	q.s.mu.Lock()
	for _, w := range ws {
		w.j.uncertain = true
	}
	q.s.mu.Unlock()
}

// inDoubt returns those of ws that may have been stored by an earlier copy.
func (q *writeQueue) inDoubt(ws []pendingWrite) []pendingWrite {
	q.s.mu.Lock()
	defer q.s.mu.Unlock()
	var in []pendingWrite
	for _, w := range ws {
		if w.j.uncertain {
			in = append(in, w)
		}
	}
	return in
}

// settle clears the uncertainty of ws: the store showed none of them stored, after a
// copy of theirs was refused, so no earlier copy can land any more.
func (q *writeQueue) settle(ws []pendingWrite) {
	q.s.mu.Lock()
	for _, w := range ws {
		w.j.uncertain = false
	}
	q.s.mu.Unlock()
}

// hurry answers the submitters of the uncertain creates among ws "Outcome unknown"
// now, for cause.
func (q *writeQueue) hurry(ws []pendingWrite, cause string) {
	var rs []*reply
	q.s.mu.Lock()
	for _, w := range ws {
		if w.rev == 0 && w.j.uncertain && w.j.answer != nil {
			rs = append(rs, w.j.answer)
			w.j.answer = nil
		}
	}
	q.s.mu.Unlock()
	for _, r := range rs {
		r.unknown(cause)
	}
}

// settled marks a reply that states what is stored: a lapsed lease does not turn it
// into "not serving" (api.endpoint), since whoever leads next reads the same store, and
// the term fences every create a newer leader could not see (batch.go).
type settled struct{ protocol.Message }

// settledSubmitted is settled{&protocol.JobSubmitted{...}} in one allocation, not two:
// the answer of every submission once its job is stored (jobSubmitted).
type settledSubmitted struct{ protocol.JobSubmitted }

// jobSubmitted is the settled JOB_SUBMITTED of job id.
func jobSubmitted(id string) protocol.Message {
	return &settledSubmitted{protocol.JobSubmitted{JobID: id}}
}

// unsettle returns the message m states when it is settled (settled, jobSubmitted),
// and whether it is.
func unsettle(m protocol.Message) (protocol.Message, bool) {
	switch s := m.(type) {
	case settled:
		return s.Message, true
	case *settledSubmitted:
		return &s.JobSubmitted, true
	}
	return m, false
}

// replies arms the answers of write requests (submissions, cancels): the scheduler's
// part that says "Outcome unknown" when a reply is due before its write's outcome.
type replies struct {
	note  *observer
	store jobStore // whose health says why a write is not confirmed
}

// A reply is a request's one answer: the outcome of its write, or "Outcome unknown" once
// it is due, whichever comes first. The write goes on either way.
type reply struct {
	rs   *replies
	fn   replyFunc
	what string                              // the request ("submission", "cancel", a group's kind), as counted
	say  func(cause string) protocol.Message // its "Outcome unknown" for a cause
	sent atomic.Bool
	t    *time.Timer
}

// by arms the answer to a request about job jobID to say "Outcome unknown" after
// due unless its outcome came first; what names the request ("submission", "cancel").
func (rs *replies) by(fn replyFunc, due time.Duration, what, jobID string) *reply {
	return rs.saying(fn, due, what, func(cause string) protocol.Message {
		return settled{protocol.OutcomeUnknown(what, jobID, cause)}
	})
}

// saying is by for a request whose "Outcome unknown" say says: one about a workflow
// or batch (what: its kind, or "retry").
func (rs *replies) saying(fn replyFunc, due time.Duration, what string, say func(cause string) protocol.Message) *reply {
	r := &reply{rs: rs, fn: fn, what: what, say: say}
	r.t = time.AfterFunc(due, func() { r.unknown(rs.unconfirmed(due)) })
	return r
}

// unknown answers "Outcome unknown" for cause, unless the answer went already: when
// the reply is due, or sooner when the store's fault is known to outlast it (hurry).
// The write goes on.
func (r *reply) unknown(cause string) {
	if r.sent.Swap(true) {
		return
	}
	r.t.Stop()
	r.rs.note.submitUnknown(r.what)
	r.fn(r.say(cause))
}

// send sends m unless the answer went already, and reports whether it did.
func (r *reply) send(m protocol.Message) bool {
	if r.sent.Swap(true) {
		return false
	}
	r.t.Stop()
	r.fn(m)
	return true
}

// unconfirmed says why a write is not confirmed after due: the store's last known
// condition, when a write failed lately. When none did (the write is still in flight),
// the store is asked, once at a time, for the answers due next.
func (rs *replies) unconfirmed(due time.Duration) string {
	msg := "its write was not confirmed within " + due.Round(time.Millisecond).String()
	h := rs.store.health()
	if d := h.recentCause(2 * due); d != nil {
		return msg + ": " + d.String()
	}
	h.slowWrite(due)
	return msg
}

// writeFailed is the reply of a request whose write failed with err: "Outcome unknown"
// or, when certainly nothing was stored, notStored's ERROR.
func writeFailed(what, jobID string, err error, notStored func() *protocol.Error) protocol.Message {
	if errors.Is(err, ErrOutcomeUnknown) {
		return settled{protocol.OutcomeUnknown(what, jobID, err.Error())}
	}
	return settled{notStored()}
}

// --- The api's half: when a request is answered at the latest.

// replyDue is how long after its arrival a request is answered at the latest: a little
// under the requester's wait (header), else Config.ReplyWithin.
func (a *api) replyDue(h nats.Header) time.Duration {
	ms, err := strconv.ParseInt(h.Get(protocol.HeaderTimeout), 10, 64)
	if err != nil || ms <= 0 {
		return a.cfg.ReplyWithin
	}
	wait := min(time.Duration(ms)*time.Millisecond, time.Hour)
	return max(wait-min(wait/10, 500*time.Millisecond), 10*time.Millisecond)
}
