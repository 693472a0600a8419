package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/jobbus/jobbus/bus/protocol"
)

// A leadership term fences every create (DESIGN invariant 3). A coordinator about to
// lead writes TermKey one higher, a CAS on the value it read, before it reads any job.
// Every message it writes afterwards that is not a CAS on a record's revision (a new
// job's record, an idempotency binding) is stored only if TermKey's last message is
// still that write (Nats-Expected-Last-Subject-Sequence with -Subject). So once a new
// leader has written its term, no job a deposed one creates can land, and whatever
// landed before is in the stream the new leader then reads. An update of a record is a
// CAS on its revision: a deposed leader's lands only where the new leader has not
// written since it read the record, and the new leader's next write of it then fails
// and makes it recover, adopting what landed. No acknowledgement rides on such a write,
// because a coordinator acknowledges nothing once its lease may have run out
// (leaseclock.go).

// claimTerm starts this coordinator's term.
func (s *jsStore) claimTerm(ctx context.Context) error {
	var prev, rev uint64
	e, err := s.kv.Get(ctx, protocol.TermKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return fmt.Errorf("read term: %w", err)
	default:
		rev = e.Revision()
		prev, _ = strconv.ParseUint(strings.Fields(string(e.Value()) + " 0")[0], 10, 64)
	}
	term := prev + 1
	value := []byte(strconv.FormatUint(term, 10) + " " + s.cfg.ID)
	var seq uint64
	if rev == 0 {
		seq, err = s.kv.Create(ctx, protocol.TermKey, value)
	} else {
		seq, err = s.kv.Update(ctx, protocol.TermKey, value, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("%w (term %d claimed by another coordinator meanwhile)", ErrFenced, term)
	}
	if err != nil {
		return fmt.Errorf("write term %d: %w", term, err)
	}
	s.prevTerm, s.term, s.termSeq = prev, term, seq
	return nil
}

// batchAck is JetStream's answer to an atomic batch's commit.
type batchAck struct {
	Error *jetstream.APIError `json:"error,omitempty"`
	Seq   uint64              `json:"seq"`
	Count int                 `json:"count"`
}

// messages are w's messages: its idempotency binding when the job is finishing (stored
// first, so a crash between the two leaves the key known: an active record carries it
// too), then its record, the last.
func (s *jsStore) messages(w *pendingWrite) []*nats.Msg {
	msgs, _ := s.messagesIn(&recordMessage{}, w, nil)
	return msgs
}

// messagesIn is messages, the record's built in m (buildRecordMsg), with reply
// made a string alongside it.
func (s *jsStore) messagesIn(m *recordMessage, w *pendingWrite, reply []byte) (msgs []*nats.Msg, replySubject string) {
	replySubject = s.buildRecordMsg(m, w, reply) // recordmsg.go
	if !w.binds() {
		return m.one[:], replySubject
	}
	b := nats.NewMsg(jobsSubjects + bindingKey(w.key))
	b.Data, _ = json.Marshal(w.bind)
	if w.ttl > 0 {
		b.Header.Set(jetstream.MsgTTLHeader, s.ttlText(w.ttl))
	}
	s.termChecked(b)
	return []*nats.Msg{b, &m.m}, replySubject
}

// termChecked makes m land only while this coordinator's term is the last.
func (s *jsStore) termChecked(m *nats.Msg) {
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(s.termSeq, 10))
	m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, termSubject)
}

// publishOne writes w's messages one after the other and returns its record's
// revision.
func (s *jsStore) publishOne(ctx context.Context, w *pendingWrite) (uint64, error) {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var rev uint64
	for _, m := range s.messages(w) {
		ack, err := s.js.PublishMsg(wctx, m)
		if err != nil {
			return 0, s.refused(ctx, err, w.rev == 0)
		}
		rev = ack.Sequence
	}
	return rev, nil
}

// publishBatch writes the messages of every write in ws as one atomic batch (group
// commit) and returns the revision of each record.
func (s *jsStore) publishBatch(ctx context.Context, ws []pendingWrite) ([]uint64, error) {
	var msgs []*nats.Msg
	at := make([]int, len(ws))
	creates := true
	for i := range ws {
		msgs = append(msgs, s.messages(&ws[i])...)
		at[i] = len(msgs) - 1
		creates = creates && ws[i].rev == 0
	}
	first, err := s.publishAtomic(ctx, msgs)
	if err != nil {
		return nil, s.refused(ctx, err, creates)
	}
	revs := make([]uint64, len(ws))
	for i, n := range at {
		revs[i] = first + uint64(n)
	}
	return revs, nil
}

// publishAtomic publishes msgs as one atomic batch and returns the first one's
// sequence: msgs[i] is stored at that plus i.
func (s *jsStore) publishAtomic(ctx context.Context, msgs []*nats.Msg) (uint64, error) {
	id := nuid.Next()
	for i, m := range msgs {
		m.Header.Set(headerBatchID, id)
		m.Header.Set(headerBatchSeq, strconv.Itoa(i+1))
	}
	last := msgs[len(msgs)-1]
	last.Header.Set(headerBatchCommit, "1")
	for _, m := range msgs[:len(msgs)-1] {
		if err := s.nc.PublishMsg(m); err != nil {
			return 0, err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	slow := time.AfterFunc(slowWriteAfter, func() { s.storage.slowWrite(slowWriteAfter) }) // outcome.go
	defer slow.Stop()
	reply, err := s.nc.RequestMsgWithContext(wctx, last)
	if err != nil {
		return 0, err
	}
	var ack batchAck
	if err := json.Unmarshal(reply.Data, &ack); err != nil {
		return 0, fmt.Errorf("batch commit: bad acknowledgement %q: %w", reply.Data, err)
	}
	switch {
	case ack.Error != nil:
		return 0, fmt.Errorf("batch commit: %w", ack.Error)
	case ack.Count != len(msgs) || ack.Seq < uint64(len(msgs)):
		return 0, fmt.Errorf("batch commit: %d messages acknowledged at %d, %d sent", ack.Count, ack.Seq, len(msgs))
	}
	return ack.Seq - uint64(len(msgs)) + 1, nil
}

const (
	headerBatchID     = "Nats-Batch-Id"
	headerBatchSeq    = "Nats-Batch-Sequence"
	headerBatchCommit = "Nats-Batch-Commit"
)

// refused explains a write refused for a revision: a newer term (another coordinator
// leads), or a record that moved (a deposed leader's update landed, or a write whose
// outcome was unknown landed after all). Either way this coordinator's memory is no
// longer the truth. Writes that check only the term (creates) and were refused while
// the term holds met a check still being replicated: they are tried again, as are
// writes refused because an earlier write of their record is still being committed
// (pendingEarlier, outcome.go): the record has not moved yet, and may never.
func (s *jsStore) refused(ctx context.Context, err error, termOnly bool) error {
	if !wrongLastSequence(err) {
		return err
	}
	e, gerr := s.kv.Get(ctx, protocol.TermKey)
	switch {
	case gerr == nil && e.Revision() != s.termSeq:
		return fmt.Errorf("%w: term %d ended; now %q (%v)", ErrFenced, s.term, e.Value(), err)
	case gerr != nil || termOnly || pendingEarlier(err):
		return err
	}
	return fmt.Errorf("%w: %w (%v)", ErrFenced, errRecordMoved, err)
}

// errRecordMoved is why a revision check failed while the term holds: the record was
// written since, by a deposed leader or by this write's own earlier copy, which only a
// read of the record tells apart (landedEarlier, outcome.go).
var errRecordMoved = errors.New("a record moved past the revision this coordinator wrote")
