package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// writeAll is a jobStore's all-or-nothing write of new records (a workflow's or a
// batch's jobs): every one is stored or none is. Once stored, each write's outcome
// reaches the sink (written) as a write handed to write would; on an error nothing
// was stored and the sink hears nothing.

// writeAll stores ws in one step of the memory store.
func (s *memStore) writeAll(ctx context.Context, ws []pendingWrite) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	revs, err := s.apply(ws)
	s.storage.noteWrite(err)
	if err != nil {
		return err
	}
	for i, w := range ws {
		s.sink.written(w.j, revs[i], w.version)
	}
	return nil
}

// ErrBatchTooLarge: a group needs a larger atomic batch than the NATS server allows
// (its jetstream max_batch_size; the embedded server of `jobbus serve` allows
// protocol.MaxWorkflowSteps and more).
var ErrBatchTooLarge = errors.New("atomic batch larger than the NATS server allows")

// writeAll stores ws as one JetStream atomic batch (each a create: one message). A
// commit whose answer was lost is settled by reading the first record back: the
// batch landed whole or not at all.
func (s *jsStore) writeAll(ctx context.Context, ws []pendingWrite) error {
	revs, err := s.publishBatch(ctx, ws)
	if err != nil && !refusedOutright(err) && !errors.Is(err, ErrFenced) && len(ws) > 0 {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, rev, rerr := s.readAt(rctx, ws[0].id)
		cancel()
		if rerr == nil && rev != 0 {
			revs, err = make([]uint64, len(ws)), nil
			for i := range ws {
				revs[i] = rev + uint64(i)
			}
		}
	}
	s.storage.noteWrite(err)
	if err != nil {
		if tooLarge(err) {
			return fmt.Errorf("%w: %d records (%v)", ErrBatchTooLarge, len(ws), err)
		}
		return err
	}
	for i, w := range ws {
		s.sink.written(w.j, revs[i], w.version)
	}
	return nil
}

// tooLarge reports JetStream's refusal of a batch over its max_batch_size.
func tooLarge(err error) bool {
	return err != nil && strings.Contains(err.Error(), "too large")
}
