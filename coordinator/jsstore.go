package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// jsStore is the JetStream jobStore: job records, idempotency bindings and the term in
// the KV bucket protocol.JobsBucket, checkpoints in protocol.CheckpointBucket. How it
// writes is chosen once, in open: atomic batches (group commit, batch.go) where each
// write costs a replication round or an fsync, else a pipeline of writes in flight
// (pipeline.go). It owns its handles, its term, the health of the store (storage.go)
// and the goroutines that write; the lifecycle hears outcomes through its sink.
type jsStore struct {
	nc  *nats.Conn
	cfg *Config // the coordinator's: open sets Replicas to the bucket's
	log *slog.Logger

	js     jetstream.JetStream
	kv     jetstream.KeyValue
	stream jetstream.Stream      // the jobs bucket's
	ckpt   jetstream.ObjectStore // checkpoints of the job index (checkpoint.go)

	prevTerm uint64 // the term before this one, whose checkpoint load may use
	term     uint64 // this coordinator's leadership term (batch.go)
	termSeq  uint64 // the stream sequence of its TermKey write, which every create checks

	lastTTL atomic.Pointer[ttlString] // the last record TTL's header value (recordmsg.go)

	// Chosen in open: how writes are written, and how a write is published when
	// commit writes (or retries) it.
	writer  jobWriter
	publish func(ctx context.Context, ws []pendingWrite) ([]uint64, error)

	sink    storeSink
	oc      writeOutcomes // what became of writes whose outcome is unknown (outcome.go)
	storage storeHealth   // whether the store had room at the last job write (storage.go)
	wg      sync.WaitGroup

	mu       sync.Mutex
	stopping bool // wait began: no goroutine starts any more (later); guarded by mu
}

// jobWriter is how a jsStore writes: batchWriter or pipeline.
type jobWriter interface {
	start(ctx context.Context) error
	write(ctx context.Context, ws []pendingWrite) bool
}

func newJetStreamStore(nc *nats.Conn, cfg *Config) *jsStore {
	s := &jsStore{nc: nc, cfg: cfg, log: cfg.Logger, storage: storeHealth{fault: cfg.StoreFault}}
	s.oc = writeOutcomes{s}
	return s
}

func (s *jsStore) open(ctx context.Context) error {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	s.js = js
	if s.kv, s.stream, err = openBuckets(ctx, s.nc, js, s.cfg); err != nil {
		return err
	}
	if s.ckpt, err = openCheckpoints(ctx, js, s.cfg.Replicas); err != nil {
		return err
	}
	diagnose := func(ctx context.Context, stream string, err error, sent time.Time) diagnosis {
		return diagnoseStream(ctx, s.nc, s.js, stream, err, sent) // diagnose.go
	}
	s.storage.diagnose.Store(&diagnose)
	slow := func(age time.Duration) {
		s.later(func() { s.diagnoseSlowWrite(age) }) // outcome.go
	}
	s.storage.slow.Store(&slow)
	if s.batching() {
		s.writer, s.publish = batchWriter{s}, s.publishBatch
	} else {
		s.writer, s.publish = &pipeline{s: s}, s.publishSingle
	}
	return s.claimTerm(ctx)
}

func (s *jsStore) terms() (prev, term uint64) { return s.prevTerm, s.term }

func (s *jsStore) start(ctx context.Context, sink storeSink) error {
	s.sink = sink
	if err := s.writer.start(ctx); err != nil {
		return err
	}
	s.goRun(func() { s.storeProber(ctx) }) // storage.go
	return nil
}

// wait waits for the store's goroutines, once its context ended.
func (s *jsStore) wait() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.wg.Wait()
}

// later runs fn on a goroutine wait waits for, unless wait began: for work a timer
// starts, which may fire at any time.
func (s *jsStore) later(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopping {
		s.goRun(fn)
	}
}

func (s *jsStore) write(ctx context.Context, ws []pendingWrite) bool {
	return s.writer.write(ctx, ws)
}

func (s *jsStore) health() *storeHealth { return &s.storage }

func (s *jsStore) goRun(fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
}

// batching reports whether writes go as atomic batches (group commit): where each
// write costs a replication round or an fsync, so that one covers many. A single
// server's atomic batch stages on disk, which costs more than it saves unless every
// write is synced. Batches go one at a time: then each carries everything that waited
// for the one before, and in a cluster JetStream refuses a batch that checks the term
// while another's check is being replicated. On a single server syncing every write,
// one batch in flight made 1,880 jobs/s where 4 made 670 and 32 made 260 (bench --jobs
// 2000 --submitters 16 --workers 1 --worker-capacity 64 --sync always).
func (s *jsStore) batching() bool {
	return s.cfg.Replicas > 1 || s.cfg.SyncAlways
}

// batchWriter writes as many jobs as are waiting in one atomic batch, one batch at a
// time: group commit, so that under load one round trip (and with SyncAlways one
// fsync) covers many transitions.
type batchWriter struct{ s *jsStore }

func (batchWriter) start(context.Context) error { return nil }

func (b batchWriter) write(ctx context.Context, ws []pendingWrite) bool {
	b.s.commit(ctx, ws)
	return true
}

// read reads the record stored last under key id. A KV get is a direct get, which any
// replica of a replicated stream answers: one that has not yet applied the latest
// write answers with an older record or none, so a job that had just finished (and
// left memory) was "Unknown job" to its waiting client. In a cluster the record is
// read from the stream's leader instead, which has every write it acknowledged.
func (s *jsStore) read(ctx context.Context, id string) ([]byte, error) {
	data, _, err := s.readAt(ctx, id)
	return data, err
}

// readAt is read with the revision (stream sequence) of what it read.
func (s *jsStore) readAt(ctx context.Context, id string) ([]byte, uint64, error) {
	data, rev, err := s.readRecord(ctx, id)
	if isNoRecord(err) {
		return nil, 0, fmt.Errorf("%w: %w", errNoRecord, err)
	}
	return data, rev, err
}

func isNoRecord(err error) bool {
	return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) || errors.Is(err, jetstream.ErrInvalidKey)
}

func (s *jsStore) readRecord(ctx context.Context, id string) ([]byte, uint64, error) {
	if s.stream == nil || s.stream.CachedInfo().Config.Replicas <= 1 {
		e, err := s.kv.Get(ctx, id)
		if err != nil {
			return nil, 0, err
		}
		return e.Value(), e.Revision(), nil
	}
	req, err := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{"$KV." + protocol.JobsBucket + "." + id})
	if err != nil {
		return nil, 0, err
	}
	m, err := s.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+s.stream.CachedInfo().Config.Name, req)
	if err != nil {
		return nil, 0, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Seq    uint64 `json:"seq"`
			Header []byte `json:"hdrs"`
			Data   []byte `json:"data"`
		} `json:"message"`
	}
	switch err := json.Unmarshal(m.Data, &resp); {
	case err != nil:
		return nil, 0, fmt.Errorf("read %s: %w", id, err)
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, 0, jetstream.ErrKeyNotFound
	case resp.Error != nil:
		return nil, 0, resp.Error
	case resp.Message == nil:
		return nil, 0, fmt.Errorf("read %s: no message in %q", id, m.Data)
	}
	if len(resp.Message.Header) > 0 {
		// A delete or purge marker, or JetStream's marker of an expired record.
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if op := h.Get("KV-Operation"); err == nil && (op == "DEL" || op == "PURGE" || h.Get("Nats-Marker-Reason") != "") {
			return nil, 0, jetstream.ErrKeyDeleted
		}
	}
	return resp.Message.Data, resp.Message.Seq, nil
}

// checkpoint writes the index as of the stream's current last sequence.
func (s *jsStore) checkpoint(ctx context.Context, index func() []head) (int, error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	heads := index()
	if heads == nil {
		return 0, nil
	}
	start := time.Now()
	data := encodeCheckpoint(s.term, info.State.LastSeq, heads)
	if _, err := s.ckpt.PutBytes(ctx, checkpointObject, data); err != nil {
		return 0, err
	}
	s.log.Debug("checkpoint written", "jobs", len(heads), "bytes", len(data), "took", time.Since(start))
	return len(heads), nil
}

// noteStored reports a write of j that began at start: a failure at once, a success
// when the lifecycle records it (noteWritten), under the lock it takes anyway. Only j's
// writer calls it, so j.took needs no lock.
func (s *jsStore) noteStored(j *job, start time.Time, err error) {
	s.storage.noteWrite(err)
	obs := s.cfg.Observer
	if obs == nil {
		return
	}
	j.took = time.Since(start)
	if err != nil {
		obs.Stored(j.took, err, false, 0)
	}
}

func (s *jsStore) controls() controlStore { return kvControls{s.kv, s.stream, s.readRecord} }
