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
// goes on instead of fencing itself. When the coordinator stops writing a job (fenced,
// closing), the store is read back once before its waiters hear anything.

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

// noteOutcome records what a failed write of ws says about their jobs: a write that may
// have been stored makes its job uncertain. Success clears it (written).
func (c *Coordinator) noteOutcome(ws []pendingWrite, err error) {
	if err == nil || refusedOutright(err) {
		return
	}
	c.mu.Lock()
	for _, w := range ws {
		w.j.uncertain = true
	}
	c.mu.Unlock()
}

// uncertain reports whether any of ws may have been stored by an earlier copy.
func (c *Coordinator) uncertain(ws []pendingWrite) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range ws {
		if w.j.uncertain {
			return true
		}
	}
	return false
}

// settleUncertain clears the uncertainty of ws: the store showed none of them stored,
// after a copy of theirs was refused, so no earlier copy can land any more.
func (c *Coordinator) settleUncertain(ws []pendingWrite) {
	c.mu.Lock()
	for _, w := range ws {
		w.j.uncertain = false
	}
	c.mu.Unlock()
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
// stream's leader (records.go), and compares it with that write: ws went in one atomic
// batch, or are one write, so the last message stands for all. On landed, revs are the
// revisions each of ws was stored at.
func (c *Coordinator) readBack(ctx context.Context, ws []pendingWrite) (landing, []uint64) {
	last := &ws[len(ws)-1]
	rctx, cancel := context.WithTimeout(ctx, readBackTimeout)
	defer cancel()
	data, seq, err := c.readRecordAt(rctx, last.id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return notLanded, nil
	case err != nil:
		c.log.Warn("could not read a job back to learn whether its write was stored", "job", last.id, "err", err)
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
func (c *Coordinator) abandon(ws []pendingWrite, batch bool, err error) {
	var doubt []pendingWrite
	c.mu.Lock()
	for _, w := range ws {
		if w.j.uncertain {
			doubt = append(doubt, w)
		}
	}
	c.mu.Unlock()
	if len(doubt) == 0 {
		c.failAllWrites(ws, err)
		return
	}
	c.failAllWrites(without(ws, doubt), err)
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
			c.settleAbandoned(ctx, g, err)
		}()
	}
	wg.Wait()
}

// settleAbandoned reads back one group of abandoned writes and ends their waiters.
func (c *Coordinator) settleAbandoned(ctx context.Context, ws []pendingWrite, err error) {
	switch l, revs := c.readBack(ctx, ws); {
	case l == landed:
		c.log.Info("a job write whose outcome was unknown was stored after all", "jobs", len(ws), "job", ws[0].id)
		for i, w := range ws {
			c.stored(w.j, revs[i], w.version)
		}
	case l == notLanded && refusedOutright(err):
		c.settleUncertain(ws)
		c.failAllWrites(ws, err)
	default:
		c.failAllWrites(ws, unknownOutcome(err))
	}
}

// failAllWrites ends the waiters of ws with err; a create that certainly was not
// stored is forgotten, as if never submitted.
func (c *Coordinator) failAllWrites(ws []pendingWrite, err error) {
	for _, w := range ws {
		if w.rev == 0 && !errors.Is(err, ErrOutcomeUnknown) {
			c.giveUp(w.j, err)
		} else {
			c.fail(w.j, err)
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
// its revisions are returned; when it holds none, nothing earlier can land any more, and
// the refusal stands.
func (c *Coordinator) landedEarlier(ctx context.Context, ws []pendingWrite, err error) ([]uint64, bool) {
	if !refusedOutright(err) || !c.uncertain(ws) {
		return nil, false
	}
	switch l, revs := c.readBack(ctx, ws); l {
	case landed:
		c.log.Info("a job write whose outcome was unknown had been stored; going on from it", "jobs", len(ws), "job", ws[0].id)
		return revs, true
	case notLanded:
		c.settleUncertain(ws)
	}
	return nil, false
}

// settled marks a reply that states what is stored: a lapsed lease does not turn it
// into "not serving" (endpoint), since whoever leads next reads the same store, and the
// term fences every create a newer leader could not see (batch.go).
type settled struct{ protocol.Message }

// A reply is a request's one answer: the outcome of its write, or "Outcome unknown" once
// it is due, whichever comes first. The write goes on either way.
type reply struct {
	c         *Coordinator
	fn        replyFunc
	what, job string // the request ("submission", "cancel") and its job
	sent      atomic.Bool
	t         *time.Timer
}

// replyBy arms the answer to a request about job jobID to say "Outcome unknown" after
// due unless its outcome came first; what names the request ("submission", "cancel").
func (c *Coordinator) replyBy(fn replyFunc, due time.Duration, what, jobID string) *reply {
	r := &reply{c: c, fn: fn, what: what, job: jobID}
	r.t = time.AfterFunc(due, func() { r.unknown(r.c.unconfirmed(due)) })
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
	r.c.noteSubmitUnknown(r.what)
	r.fn(settled{protocol.OutcomeUnknown(r.what, r.job, cause)})
}

// hurry answers the submitters of the uncertain creates among ws "Outcome unknown" now,
// with the store's fault (err, from storeFailure), rather than when their replies are
// due: a full or read-only disk outlasts a request. Their writes go on, and a job whose
// write lands later runs.
func (c *Coordinator) hurry(ws []pendingWrite, err error) {
	var rs []*reply
	c.mu.Lock()
	for _, w := range ws {
		if w.rev == 0 && w.j.uncertain && w.j.answer != nil {
			rs = append(rs, w.j.answer)
			w.j.answer = nil
		}
	}
	c.mu.Unlock()
	if len(rs) == 0 {
		return
	}
	cause := storeCause(err)
	for _, r := range rs {
		r.unknown(cause)
	}
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
// the jobs stream is asked, once at a time, for the answers due next.
func (c *Coordinator) unconfirmed(due time.Duration) string {
	s := "its write was not confirmed within " + due.Round(time.Millisecond).String()
	if d := c.storage.recentCause(2 * due); d != nil {
		return s + ": " + d.String()
	}
	c.slowWrite(due)
	return s
}

// slowWriteAfter is how long a write goes unacknowledged before the jobs stream is
// asked why (slowWrite): a healthy one acknowledges in milliseconds.
const slowWriteAfter = time.Second

// slowWrite has the jobs stream asked, once at a time, why a write sent age ago is not
// acknowledged yet, for the answers due next (unconfirmed).
func (c *Coordinator) slowWrite(age time.Duration) {
	if c.storage.recentCause(age) != nil || !c.storage.diagnosing.CompareAndSwap(false, true) {
		return
	}
	c.goLater(func() {
		defer c.storage.diagnosing.Store(false)
		c.diagnoseSlowWrite(age)
	})
}

// diagnoseSlowWrite asks the jobs stream why a write sent due ago is not confirmed,
// and remembers it for the answers due next. A settled leader that answers is not
// taken for a stalled disk here: the write may only be slow.
func (c *Coordinator) diagnoseSlowWrite(due time.Duration) {
	if c.js == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), readBackTimeout)
	defer cancel()
	d := diagnoseStream(ctx, c.nc, c.js, jobsStream, context.DeadlineExceeded, time.Now().Add(-due))
	if d.cond == condStalled {
		d = diagnosis{cond: condUnanswered, stream: jobsStream, detail: "stream " + jobsStream + "'s leader answers, and has not confirmed it yet"}
	}
	c.storage.noteCause(d)
}

// writeFailed is the reply of a request whose write failed with err: "Outcome unknown"
// or, when certainly nothing was stored, notStored's ERROR.
func writeFailed(what, jobID string, err error, notStored func() *protocol.Error) protocol.Message {
	if errors.Is(err, ErrOutcomeUnknown) {
		return settled{protocol.OutcomeUnknown(what, jobID, err.Error())}
	}
	return settled{notStored()}
}

// replyDue is how long after its arrival a request is answered at the latest: a little
// under the requester's wait (header), else Config.ReplyWithin.
func (c *Coordinator) replyDue(h nats.Header) time.Duration {
	ms, err := strconv.ParseInt(h.Get(protocol.HeaderTimeout), 10, 64)
	if err != nil || ms <= 0 {
		return c.cfg.ReplyWithin
	}
	wait := min(time.Duration(ms)*time.Millisecond, time.Hour)
	return max(wait-min(wait/10, 500*time.Millisecond), 10*time.Millisecond)
}
