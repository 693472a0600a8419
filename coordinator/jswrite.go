package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/backoff"
)

// How the JetStream store writes job records: commit, the classification of failures
// and the retries every writer shares.

// markerTTL is how long the marker JetStream leaves when a finished record expires
// stays: a live watcher (jobbus watch, the dashboard) sees it at once, and each marker
// costs the server memory, so it goes soon (with 1 minute, serve under full load with
// --retention 30s held about 60% more memory).
const markerTTL = 5 * time.Second

// openBuckets opens the jobs bucket, whose stream takes atomic batches (group commit,
// batch.go), and returns its stream too, which recovery and checkpoints read. OpenBucket (buckets.go) waits for the cluster and checks the replica count;
// c.Replicas becomes the bucket's (0 picks one: buckets.go).
func openBuckets(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, c *Config) (jetstream.KeyValue, jetstream.Stream, error) {
	// LimitMarkerTTL turns on per-message TTLs, which retention uses.
	jobs, err := OpenBucket(ctx, nc, js, *c, jetstream.KeyValueConfig{
		Bucket: protocol.JobsBucket, Description: "jobbus job records, idempotency keys and leadership term",
		History: 1, Storage: jetstream.FileStorage, LimitMarkerTTL: markerTTL, MaxBytes: jobsMaxBytes(c)})
	if err != nil {
		return nil, nil, err
	}
	stream, err := js.Stream(ctx, jobsStream)
	if err != nil {
		return nil, nil, fmt.Errorf("open bucket %s: %w", protocol.JobsBucket, err)
	}
	c.Replicas = stream.CachedInfo().Config.Replicas
	if cfg := stream.CachedInfo().Config; !cfg.AllowAtomicPublish {
		cfg.AllowAtomicPublish = true
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return nil, nil, fmt.Errorf("bucket %s: allow atomic batches: %w", protocol.JobsBucket, err)
		}
	}
	return jobs, stream, nil
}

// storeHeadroom is the least room jobsMaxBytes leaves free: the leader lease, renewed
// in place, takes a few hundred bytes, the task types a few KiB.
const storeHeadroom = 1 << 20

// jobsMaxBytes is the jobs bucket's limit (max bytes) on a store JetStream caps at
// cfg.StoreLimit, 0 (keep the bucket's) when that is unknown or too small to share.
// JetStream refuses every file write at its cap, the leader lease's renewal too; a
// KV bucket refuses a write its limit cannot take (it discards new, never drops an old
// record) with "maximum bytes exceeded", which StoreFull counts as full. So with the
// jobs under the cap, a store full of jobs refuses submissions while the lease is
// still renewed. The job logs' stream, bounded on its own (logsMaxBytes: at most a
// quarter of the cap), is set aside; of the rest a fifth is left for the checkpoint of
// the job index, which grows with the jobs (checkpoint.go: some 50 bytes a job, twice
// while a new one replaces the old), the lease and the task types. A larger cap never
// gives the jobs less.
func jobsMaxBytes(cfg *Config) int64 {
	room := cfg.StoreLimit - logsMaxBytes(cfg)
	headroom := max(room/5, storeHeadroom)
	if room < 2*headroom {
		return 0
	}
	return room - headroom
}

// commit makes ws durable as one write (s.publish), retrying transient failures until ctx ends.
func (s *jsStore) commit(ctx context.Context, ws []pendingWrite) {
	for attempt := 0; ; attempt++ {
		start := time.Now()
		revs, err := s.publish(ctx, ws)
		if err != nil {
			// A copy refused after an earlier one went unanswered: the earlier one
			// may be what the store holds (outcome.go).
			revs, err = s.oc.landedEarlier(ctx, ws, err)
		}
		for _, w := range ws {
			s.noteStored(w.j, start, err)
		}
		s.oc.note(ws, err)
		batch := len(ws) > 1 || s.batching()
		switch {
		case err == nil:
			done := make([]ackedWrite, len(ws))
			for i, w := range ws {
				done[i] = ackedWrite{w.j, revs[i], w.version}
			}
			s.sink.writtenAll(done)
			return
		case permanent(err) && len(ws) > 1:
			// Find the one that cannot be written; the others can.
			for _, w := range ws {
				s.commit(ctx, []pendingWrite{w})
			}
			return
		case permanent(err):
			s.log.Error("job write impossible; giving up on it", "job", ws[0].id, "err", err)
			s.oc.abandon(ws, batch, err)
			return
		case errors.Is(err, ErrFenced) || ctx.Err() != nil:
			s.oc.abandon(ws, batch, err)
			if errors.Is(err, ErrFenced) {
				s.sink.fence(err)
			}
			return
		}
		if ferr := s.storeFailure(ctx, err); ferr != nil {
			// A job not yet stored is given up, so its submitter hears "store full"
			// now rather than JOB_SUBMITTED much later, or never; accepted jobs wait
			// for room (storage.go).
			if ws = s.dropCreates(ws, ferr); len(ws) == 0 {
				return
			}
		}
		s.log.Warn("job write failed; retrying", "jobs", len(ws), "err", err, "attempt", attempt)
		select {
		case <-ctx.Done():
			s.oc.abandon(ws, batch, ctx.Err())
			return
		case <-time.After(backoff.Policy{Base: 50 * time.Millisecond, Max: time.Second}.Delay(attempt)):
		}
	}
}

// dropCreates gives up the creates among ws with err and returns the other writes. A
// create an earlier copy of which may have been stored is kept: it is written until it
// lands or is refused for good, and its submitter hears "Outcome unknown" when the reply
// is due first (outcome.go), never "not stored".
func (s *jsStore) dropCreates(ws []pendingWrite, err error) []pendingWrite {
	doubt := make(map[*job]bool)
	for _, w := range s.sink.doubts().inDoubt(ws) {
		doubt[w.j] = true
	}
	var kept, gone []pendingWrite
	for _, w := range ws {
		if w.rev != 0 || doubt[w.j] {
			kept = append(kept, w)
		} else {
			gone = append(gone, w)
		}
	}
	for _, w := range gone {
		s.sink.giveUp(w.j, err)
	}
	s.oc.hurry(kept, err) // outcome.go
	return kept
}

// messageCount is how many messages w writes (messages).
func (w *pendingWrite) messageCount() int {
	if !w.binds() {
		return 1
	}
	return 2
}

// publishSingle writes one job's messages one after the other: how the pipeline's
// writes are retried.
func (s *jsStore) publishSingle(ctx context.Context, ws []pendingWrite) ([]uint64, error) {
	rev, err := s.publishOne(ctx, &ws[0])
	return []uint64{rev}, err
}

// wrongLastSequence reports a publish refused because the subject's last message was
// not the one expected: someone else wrote the record. A replicated stream says so
// with a code of its own.
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// permanent reports a write error that retrying cannot cure. The submission bounds
// (payload and key sizes, result truncation) keep it from happening.
func permanent(err error) bool {
	return errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, jetstream.ErrInvalidKey)
}

const (
	jobsStream    = "KV_" + protocol.JobsBucket
	jobsSubjects  = "$KV." + protocol.JobsBucket + "."
	termSubject   = jobsSubjects + protocol.TermKey
	recordsFilter = jobsSubjects + "*"
)
