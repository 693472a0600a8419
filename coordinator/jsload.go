package coordinator

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// What the JetStream store reads for recovery: every record's headers, or a checkpoint
// and what was written after it, the active jobs' records whole, and the idempotency
// bindings.

// errStaleCheckpoint: so much was written after the checkpoint that reading every
// record's headers is quicker than replaying.
var errStaleCheckpoint = errors.New("checkpoint too old to replay")

// loadIndex reads the heads of every job: from the checkpoint of the last term and what
// was written after it, when there is one, else from every record's headers.
func (s *jsStore) loadIndex(ctx context.Context) (heads []head, lastSeq uint64, binds []storedBinding, fromCheckpoint bool, err error) {
	if at, ckpt, ok := s.loadCheckpoint(ctx, s.prevTerm); ok {
		heads, lastSeq, binds, err = s.replay(ctx, at, ckpt)
		if err == nil {
			s.log.Info("recovering from a checkpoint", "jobs", len(ckpt), "at", at, "stream_last", lastSeq)
			return heads, lastSeq, binds, true, nil
		}
		level := slog.LevelWarn
		if errors.Is(err, errStaleCheckpoint) {
			level = slog.LevelInfo
		}
		s.log.Log(ctx, level, "checkpoint not replayed; reading every record's headers", "err", err)
	}
	heads, lastSeq, err = s.loadHeads(ctx)
	return heads, lastSeq, nil, false, err
}

// replay brings a checkpoint's heads up to date with the records and bindings written
// after sequence at.
func (s *jsStore) replay(ctx context.Context, at uint64, heads []head) ([]head, uint64, []storedBinding, error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return nil, 0, nil, err
	}
	last := info.State.LastSeq
	// Reading messages after a sequence costs the server more per message than the
	// last message of each subject: past a point, reading everything is quicker.
	if last-at > uint64(len(heads))/2+minCheckpointWrites/10 {
		return nil, 0, nil, fmt.Errorf("%d writes since the checkpoint of %d jobs: %w", last-at, len(heads), errStaleCheckpoint)
	}
	changed := make(map[string]*head) // nil: removed
	after := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: at + 1,
		HeadersOnly: true, FilterSubjects: []string{recordsFilter}}
	err = consume(ctx, s.stream, after, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) {
		id := strings.TrimPrefix(msg.Subject(), jobsSubjects)
		if h, ok := readHead(id, msg.Headers(), meta); ok {
			changed[id] = &h
		} else {
			changed[id] = nil
		}
	})
	if err != nil {
		return nil, 0, nil, err
	}
	bound := make(map[string][]byte) // nil: removed
	after.HeadersOnly, after.FilterSubjects = false, []string{jobsSubjects + protocol.KeyPrefix + ">"}
	err = consume(ctx, s.stream, after, func(msg jetstream.Msg, _ *jetstream.MsgMetadata) {
		key := strings.TrimPrefix(msg.Subject(), jobsSubjects)
		if removal(msg.Headers()) {
			bound[key] = nil
		} else {
			bound[key] = bytes.Clone(msg.Data())
		}
	})
	if err != nil {
		return nil, 0, nil, err
	}
	out := heads[:0]
	for _, h := range heads {
		ch, ok := changed[h.id]
		switch {
		case !ok:
			out = append(out, h)
		case ch != nil:
			if ch.key == "" && h.state == "" {
				// Active at the checkpoint: a finishing write's binding may have been
				// stored at or before its sequence, and the record after it.
				ch.key, ch.fingerprint = h.key, h.fingerprint
			}
			out = append(out, *ch)
		}
		delete(changed, h.id)
	}
	for _, ch := range changed {
		if ch != nil {
			out = append(out, *ch)
		}
	}
	binds := make([]storedBinding, 0, len(bound))
	for k, v := range bound {
		if v != nil {
			binds = append(binds, storedBinding{k, v})
		}
	}
	return out, last, binds, nil
}

// loadHeads reads the headers of every record in the jobs bucket (an ordered consumer
// that delivers headers only, the last message of each key), and the stream's last
// sequence.
func (s *jsStore) loadHeads(ctx context.Context) ([]head, uint64, error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return nil, 0, err
	}
	if info.State.Msgs == 0 {
		return nil, info.State.LastSeq, nil
	}
	var heads []head
	last := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		HeadersOnly: true, FilterSubjects: []string{recordsFilter}}
	err = consume(ctx, s.stream, last, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) {
		id := strings.TrimPrefix(msg.Subject(), jobsSubjects)
		if h, ok := readHead(strings.Clone(id), msg.Headers(), meta); ok {
			heads = append(heads, h)
		}
	})
	return heads, info.State.LastSeq, err
}

// removal reports a KV delete or purge, or an expiry marker.
func removal(h nats.Header) bool {
	return h.Get("KV-Operation") != "" || h.Get("Nats-Marker-Reason") != ""
}

// readHead reads a record's headers; false for a removal.
func readHead(id string, h nats.Header, meta *jetstream.MsgMetadata) (head, bool) {
	if removal(h) {
		return head{}, false
	}
	seq, _ := strconv.ParseUint(h.Get(protocol.HeaderSeq), 10, 64)
	st, _ := protocol.ParseState(h.Get(protocol.HeaderState)) // the constant, not a copy per job
	expires, _ := strconv.ParseInt(h.Get(protocol.HeaderExpires), 10, 64)
	until, _ := strconv.ParseInt(h.Get(protocol.HeaderUniqueUntil), 10, 64)
	due, _ := strconv.ParseInt(h.Get(protocol.HeaderRunAt), 10, 64)
	if st == protocol.StateScheduled && h.Get(protocol.HeaderUniqueUntil) == "" {
		// Written by a release before SCHEDULED records said whether they hold a unique
		// key: it may hold one until it is due, so its record is read whole.
		until = due
	}
	var queue string
	if st == protocol.StateScheduled {
		queue = h.Get(protocol.HeaderQueue) // "" from a release before it: read whole (readWhole)
	}
	return head{id: id, seq: seq, state: st, at: meta.Timestamp, expires: expires, uniqueUntil: until, due: due, queue: queue}, true
}

// consume hands fn the messages of an ordered consumer of stream with cfg, until none
// is pending (caughtUp), and deletes the consumer rather than leave it to time out. pull bounds
// the messages fetched ahead (default: 4096, for headers only).
func consume(ctx context.Context, stream jetstream.Stream, cfg jetstream.OrderedConsumerConfig, fn func(jetstream.Msg, *jetstream.MsgMetadata), pull ...jetstream.PullMessagesOpt) error {
	cons, err := stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if ci := cons.CachedInfo(); ci != nil {
			_ = stream.DeleteConsumer(context.WithoutCancel(ctx), ci.Name)
		}
	}()
	if ci, err := cons.Info(ctx); err != nil || ci.NumPending == 0 {
		return err
	}
	if len(pull) == 0 {
		pull = []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(4096)}
	}
	it, err := cons.Messages(pull...)
	if err != nil {
		return err
	}
	defer it.Stop()
	var last uint64  // the stream sequence of the last message delivered
	doubted := false // the server's count said none pending while one was
	for {
		msg, err := next(ctx, it, doubted)
		if errors.Is(err, errNoneYet) {
			if done, err := caughtUp(ctx, stream, cfg.FilterSubjects, last); done || err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		fn(msg, meta)
		last = meta.Sequence.Stream
		if meta.NumPending == 0 {
			done, err := caughtUp(ctx, stream, cfg.FilterSubjects, last)
			if done || err != nil {
				return err
			}
			doubted = true
		}
	}
}

// errNoneYet: no message came within doubtWait of a count doubted.
var errNoneYet = errors.New("no message yet")

// doubtWait is how long a consumer whose count was doubted waits for a message before
// it looks again whether one is still to come (it may have been removed meanwhile).
const doubtWait = time.Second

// next returns the consumer's next message; once doubted, it waits at most doubtWait.
func next(ctx context.Context, it jetstream.MessagesContext, doubted bool) (jetstream.Msg, error) {
	if !doubted {
		return it.Next(jetstream.NextContext(ctx))
	}
	wait, cancel := context.WithTimeout(ctx, doubtWait)
	defer cancel()
	msg, err := it.Next(jetstream.NextContext(wait))
	if err != nil && ctx.Err() == nil && wait.Err() != nil {
		return nil, errNoneYet
	}
	return msg, err
}

// caughtUp reports whether no message under filters follows sequence seq. A
// consumer's NumPending is the server's running count, not a fresh one: a message
// removed while the last of each subject is delivered (a key rewritten meanwhile) can
// take it to 0 while the rewrite is still to come. The stream's last sequence answers
// most calls; a filter's last message costs the server a walk of the filter's subjects
// (about 20 ms for 500,000 keys here), once a listing.
func caughtUp(ctx context.Context, stream jetstream.Stream, filters []string, seq uint64) (bool, error) {
	info, err := stream.Info(ctx)
	if err != nil || info.State.LastSeq <= seq {
		return err == nil, err
	}
	for _, f := range filters {
		m, err := stream.GetLastMsgForSubject(ctx, f)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, err
		}
		if m.Sequence > seq {
			return false, nil
		}
	}
	return true, nil
}

// kvKeys hands fn every key under filter (">" for all) of the KV bucket whose stream
// is stream and whose subjects start with prefix ("$KV.<bucket>."): the last message of
// each key, read until none is pending, as recovery reads the records. Not kv.ListKeys:
// its watcher stops after as many messages as were pending when it began, so a key
// rewritten meanwhile, counted twice, hides another rewritten before it was read,
// which is never seen. Here a key stored throughout is seen at least once; one removed
// meanwhile may be too (fn's read of it finds it gone). After an error of fn's, fn
// is called no more, and kvKeys returns that error.
func kvKeys(ctx context.Context, stream jetstream.Stream, prefix, filter string, fn func(key string) error) error {
	last := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		HeadersOnly: true, FilterSubjects: []string{prefix + filter}}
	var fnErr error
	err := consume(ctx, stream, last, func(msg jetstream.Msg, _ *jetstream.MsgMetadata) {
		if fnErr == nil && !removal(msg.Headers()) {
			fnErr = fn(strings.TrimPrefix(msg.Subject(), prefix))
		}
	})
	return cmp.Or(fnErr, err)
}

// loadRecords reads the records of ids, a few at a time; one gone meanwhile (it
// expired) is left out. A finished one comes with the end of retention its headers
// give, which recovery keeps rather than the retention it runs with (restoreFinished).
func (s *jsStore) loadRecords(ctx context.Context, ids []string) ([]stored, error) {
	var (
		mu    sync.Mutex
		out   []stored
		first error
		wg    sync.WaitGroup
		next  = make(chan string)
	)
	for range min(8, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range next {
				m, err := s.stream.GetLastMsgForSubject(ctx, jobsSubjects+id)
				var r protocol.Record
				if err == nil && !removal(m.Header) {
					err = json.Unmarshal(m.Data, &r)
					if err != nil { // unreadable: skipped, as before
						s.log.Warn("skipping unreadable job record", "key", id, "err", err)
						continue
					}
				}
				mu.Lock()
				switch {
				case errors.Is(err, jetstream.ErrMsgNotFound), err == nil && removal(m.Header):
				case err != nil:
					first = cmp.Or(first, err)
				default:
					expires, _ := strconv.ParseInt(m.Header.Get(protocol.HeaderExpires), 10, 64)
					out = append(out, stored{Record: r, rev: m.Sequence, expires: expires})
				}
				mu.Unlock()
			}
		}()
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	return out, first
}

// repairBindings hands keep every binding stored, to rebuild the idempotency bindings of finished jobs (doneKeys) from
// the bindings stored beside the records, keeping the records as the truth: a binding
// whose job is gone or unknown is left alone, free to be written over.
func (s *jsStore) repairBindings(ctx context.Context, keep func(key string, value []byte) bool) error {
	last := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		FilterSubjects: []string{jobsSubjects + protocol.KeyPrefix + ">"}}
	err := consume(ctx, s.stream, last, func(msg jetstream.Msg, _ *jetstream.MsgMetadata) {
		if removal(msg.Headers()) {
			return
		}
		keep(strings.TrimPrefix(msg.Subject(), jobsSubjects), msg.Data())
	})
	if err != nil {
		return fmt.Errorf("load bindings: %w", err)
	}
	return nil
}

// moveOldBindings moves the bindings of kept jobs out of protocol.KeysBucket, where
// versions before the single jobs stream kept them, into the jobs bucket (fenced
// batches, as every write), then deletes that bucket.
func (s *jsStore) moveOldBindings(ctx context.Context, keep func(key string, value []byte) bool) error {
	old, err := s.js.KeyValue(ctx, protocol.KeysBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("open old bucket %s: %w", protocol.KeysBucket, err)
	}
	entries, err := loadAll(ctx, old, ">")
	if err != nil {
		return fmt.Errorf("load old bucket %s: %w", protocol.KeysBucket, err)
	}
	var msgs []*nats.Msg
	flush := func() error {
		if len(msgs) > 0 {
			if _, err := s.publishAtomic(ctx, msgs); err != nil {
				return fmt.Errorf("move bindings from %s: %w", protocol.KeysBucket, err)
			}
		}
		msgs = msgs[:0]
		return nil
	}
	for _, e := range entries {
		if !keep(e.Key(), e.Value()) {
			continue
		}
		m := nats.NewMsg(jobsSubjects + e.Key()) // the same encoding
		m.Data = e.Value()
		s.termChecked(m)
		if msgs = append(msgs, m); len(msgs) == 500 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	s.log.Info("moved idempotency bindings into the jobs bucket", "from", protocol.KeysBucket, "bindings", len(entries))
	return s.js.DeleteKeyValue(ctx, protocol.KeysBucket)
}

// loadAll reads every current entry of a bucket whose key matches filter.
func loadAll(ctx context.Context, kv jetstream.KeyValue, filter string) ([]jetstream.KeyValueEntry, error) {
	w, err := kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	var out []jetstream.KeyValueEntry
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("watch closed before the initial values were read")
			}
			if e == nil {
				return out, nil
			}
			out = append(out, e)
		}
	}
}

// loadCheckpoint reads the checkpoint written in term, if there is one.
func (s *jsStore) loadCheckpoint(ctx context.Context, term uint64) (at uint64, heads []head, ok bool) {
	if s.cfg.fullRecovery {
		return 0, nil, false
	}
	data, err := s.ckpt.GetBytes(ctx, checkpointObject)
	if err != nil {
		if !errors.Is(err, jetstream.ErrObjectNotFound) {
			s.log.Warn("checkpoint not read; reading every record's headers", "err", err)
		}
		return 0, nil, false
	}
	written, at, heads, err := decodeCheckpoint(data)
	switch {
	case err != nil:
		s.log.Warn("checkpoint not usable; reading every record's headers", "err", err)
		return 0, nil, false
	case written != term:
		s.log.Info("checkpoint of another term; reading every record's headers", "checkpoint_term", written, "last_term", term)
		return 0, nil, false
	}
	now := time.Now()
	for i := range heads {
		heads[i].at = now // retention of a job kept for ever, should it be turned on, counts from now
	}
	return at, heads, true
}

// load reads every kept job's head, from the checkpoint of the last term when there is
// one, and the records of the active jobs whole.
func (s *jsStore) load(ctx context.Context) (*loaded, error) {
	heads, lastSeq, binds, fromCheckpoint, err := s.loadIndex(ctx)
	if err != nil {
		return nil, err
	}
	// Active jobs (but SCHEDULED ones due beyond the window, delayed.go), records older
	// than the headers, and finished jobs that hold a unique window (unique.go).
	var whole []string
	now := s.cfg.Now()
	coldAfter := now.Add(s.cfg.ScheduleWindow).UnixMilli()
	for i, h := range heads {
		if held := h.uniqueUntil > now.UnixMilli(); readWhole(h, coldAfter) || held {
			heads[i] = wholeHead(h)
			whole = append(whole, h.id)
		}
	}
	recs, err := s.loadRecords(ctx, whole)
	if err != nil {
		return nil, err
	}
	return &loaded{heads: heads, records: recs, lastSeq: lastSeq, binds: binds, fromCheckpoint: fromCheckpoint, coldAfter: coldAfter}, nil
}

// bindings moves the bindings of the old keys bucket and, with every, hands keep every
// binding stored.
func (s *jsStore) bindings(ctx context.Context, every bool, keep func(key string, value []byte) bool) error {
	if err := s.moveOldBindings(ctx, keep); err != nil {
		return err
	}
	if every {
		return s.repairBindings(ctx, keep)
	}
	return nil
}
