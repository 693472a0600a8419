package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// writeAll is a jobStore's all-or-nothing write of new records and one control (a
// workflow's or a batch's jobs and its description): every one is stored or none
// is. The control is a create (rev 0) or a CAS on rev, as controlStore.put; records
// are creates. Once stored, each record's outcome reaches the sink (written) as a
// write handed to write would, and writeAll returns the control's new revision; on
// an error the sink hears nothing, and nothing was stored unless the error is
// ErrOutcomeUnknown (then all may be, later).

// writeAll stores ctl and ws in one step of the memory store.
func (s *memStore) writeAll(ctx context.Context, ctl control, ws []pendingWrite) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b := s.b
	b.mu.Lock()
	if b.controls[ctl.key].seq != ctl.rev {
		b.mu.Unlock()
		return 0, fmt.Errorf("%s: %w", ctl.key, errControlChanged)
	}
	b.mu.Unlock()
	// The memory store's writes are all on the caller's goroutine: nothing runs
	// between the check above and the writes below but other goroutines' writes of
	// other keys (a group's control is written only here, by the leader).
	revs, err := s.apply(ws)
	s.storage.noteWrite(err)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	b.seq++
	rev := b.seq
	b.controls[ctl.key] = memMessage{data: slices.Clone(ctl.value), seq: rev, at: b.clock()}
	b.mu.Unlock()
	for i, w := range ws {
		s.sink.written(w.j, revs[i], w.version)
	}
	return rev, nil
}

// ErrBatchTooLarge: a group needs a larger atomic batch than the NATS server allows
// (its jetstream max_batch_size; an embedded server allows
// embeddednats.MaxAtomicBatch).
var ErrBatchTooLarge = errors.New("atomic batch larger than the NATS server allows (its jetstream max_batch_size)")

// writeAll stores ctl and ws as one JetStream atomic batch (each record a create: one
// message). A commit whose answer was lost is settled by reading the control back:
// the batch landed whole or not at all. When the control is not there (yet), the
// outcome is unknown (ErrOutcomeUnknown), not "not stored": in a cluster the stream's
// leader may have proposed the batch without a quorum, and commits it once a follower
// answers, unseen by reads till then (outcome.go). Its jobs are then in doubt, as any
// job whose write went unanswered, and the same batch written again (settleSteps) is
// settled as a job's copy is: refused, it is read back, and the earlier copy found
// stored is its success (landedEarlier); refused because the earlier copy is still
// being committed (pendingEarlier), or not read back, its outcome stays unknown.
func (s *jsStore) writeAll(ctx context.Context, ctl control, ws []pendingWrite) (uint64, error) {
	c := nats.NewMsg(jobsSubjects + protocol.ControlPrefix + ctl.key)
	c.Data = ctl.value
	c.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(ctl.rev, 10))
	msgs := []*nats.Msg{c}
	for i := range ws {
		msgs = append(msgs, s.messages(&ws[i])...)
	}
	if len(msgs) != len(ws)+1 {
		return 0, fmt.Errorf("write group %s: a record of more than one message", ctl.key)
	}
	first, err := s.publishAtomic(ctx, msgs)
	if ctl.rev == 0 && wrongLastSequence(err) {
		// A create of a control removed before (an expired group's, purged as it was
		// forgotten) meets the marker its removal left, as kv.Create does: the key
		// holds nothing, so the create expects that marker instead.
		if marker := s.removedControl(ctx, ctl.key); marker != 0 {
			c.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(marker, 10))
			first, err = s.publishAtomic(ctx, msgs)
		}
	}
	if err != nil && !wrongLastSequence(err) && !tooLarge(err) {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		e, rerr := s.kv.Get(rctx, protocol.ControlPrefix+ctl.key)
		cancel()
		if rerr == nil && string(e.Value()) == string(ctl.value) && e.Revision() != ctl.rev {
			first, err = e.Revision(), nil
		} else if !refusedOutright(err) {
			err = unknownOutcome(err)
		}
	}
	if err != nil && len(ws) > 0 {
		if revs, lerr := s.oc.landedEarlier(ctx, ws, err); lerr == nil {
			first, err = revs[0]-1, nil // the control went first, the records after it
		}
	}
	s.oc.note(ws, err)
	s.storage.noteWrite(err)
	switch {
	case err != nil && tooLarge(err):
		return 0, fmt.Errorf("%w: %d messages (%v)", ErrBatchTooLarge, len(msgs), err)
	case err != nil && wrongLastSequence(err):
		if ferr := s.refused(ctx, err, true); errors.Is(ferr, ErrFenced) {
			return 0, ferr
		}
		if len(s.sink.doubts().inDoubt(ws)) > 0 {
			// An earlier copy is still being committed, or could not be read back:
			// it may be what the store holds.
			return 0, unknownOutcome(err)
		}
		return 0, fmt.Errorf("%s: %w", ctl.key, errControlChanged)
	case err != nil:
		return 0, err
	}
	for i, w := range ws {
		s.sink.written(w.j, first+1+uint64(i), w.version)
	}
	return first, nil
}

// removedControl is the revision of the marker that control key's removal left (a
// purge or delete, or JetStream's marker of an expired message) when that is the
// key's last message, else 0.
func (s *jsStore) removedControl(ctx context.Context, key string) uint64 {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := s.stream.GetLastMsgForSubject(rctx, jobsSubjects+protocol.ControlPrefix+key)
	if err != nil || !removal(m.Header) {
		return 0
	}
	return m.Sequence
}

// tooLarge reports JetStream's refusal of a batch over its max_batch_size.
func tooLarge(err error) bool {
	return err != nil && strings.Contains(err.Error(), "too large")
}
