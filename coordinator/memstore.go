package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// memBackend is an in-memory stand-in for the jobs bucket: one sequence for every
// message, the last record of each job, the last binding of each idempotency key and
// the term. The memStores of successive coordinators share one, as coordinators share
// a JetStream server, so a new term fences the one before it here too.
type memBackend struct {
	now func() time.Time // for the TTL of finished records; nil: time.Now

	mu       sync.Mutex
	seq      uint64 // the last sequence given
	term     uint64
	termSeq  uint64 // the sequence of the last term claimed
	records  map[string]memMessage
	bindings map[string]memMessage
	controls map[string]memMessage // controls.go
	index    []head                // the last checkpoint, with the sequence it was taken at
	indexAt  uint64
}

// memMessage is a stored message: its data, sequence, when it was written and when
// it expires (0: never).
type memMessage struct {
	data    []byte
	seq     uint64
	state   protocol.State
	recSeq  uint64 // a record's job sequence
	at      time.Time
	expires time.Time
	ends    int64  // a finished record's end of retention, Unix milliseconds (HeaderExpires)
	unique  int64  // a record's protocol.HeaderUniqueUntil
	runAt   int64  // a SCHEDULED record's due time (HeaderRunAt)
	queue   string // a SCHEDULED record's queue (HeaderQueue)
}

func newMemBackend() *memBackend {
	return &memBackend{records: make(map[string]memMessage), bindings: make(map[string]memMessage), controls: make(map[string]memMessage)}
}

func (b *memBackend) clock() time.Time {
	if b.now != nil {
		return b.now()
	}
	return time.Now()
}

// live reports whether m has not expired.
func (b *memBackend) live(m memMessage, now time.Time) bool {
	return m.expires.IsZero() || now.Before(m.expires)
}

// memStore is the in-memory jobStore, for tests of the lifecycle that need no NATS. It
// keeps the contract of the JetStream store (jobstore.go): creates fenced by the term,
// updates a CAS on the revision, a finishing write's binding before its record, each
// write handed to it atomic. It writes on the committer's goroutine, so a write is
// durable (as durable as memory) when write returns; it owns no goroutine.
type memStore struct {
	b *memBackend

	prevTerm, term, termSeq uint64

	sink    storeSink
	storage storeHealth
}

func newMemStore(b *memBackend) *memStore { return &memStore{b: b} }

func (s *memStore) open(context.Context) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.prevTerm = s.b.term
	s.b.term++
	s.b.seq++
	s.term, s.termSeq = s.b.term, s.b.seq
	s.b.termSeq = s.b.seq
	return nil
}

func (s *memStore) terms() (prev, term uint64) { return s.prevTerm, s.term }

func (s *memStore) start(_ context.Context, sink storeSink) error {
	s.sink = sink
	return nil
}

func (s *memStore) wait() {}

func (s *memStore) health() *storeHealth { return &s.storage }

func (s *memStore) write(ctx context.Context, ws []pendingWrite) bool {
	if err := ctx.Err(); err != nil {
		for _, w := range ws {
			s.sink.fail(w.j, err)
		}
		return false
	}
	revs, err := s.apply(ws)
	s.storage.noteWrite(err)
	if err != nil {
		for _, w := range ws {
			s.sink.fail(w.j, err)
		}
		s.sink.fence(err)
		return true
	}
	for i, w := range ws {
		s.sink.written(w.j, revs[i], w.version)
	}
	return true
}

// apply stores ws all at once, or none of them: a create only while this store's term
// is the last, an update only over the revision it names.
func (s *memStore) apply(ws []pendingWrite) ([]uint64, error) {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock()
	for _, w := range ws {
		if w.rev == 0 || w.binds() {
			if b.termSeq != s.termSeq {
				return nil, fmt.Errorf("%w: term %d ended; now %d", ErrFenced, s.term, b.term)
			}
		}
		if w.rev != 0 {
			if m, ok := b.records[w.id]; !ok || m.seq != w.rev {
				return nil, fmt.Errorf("%w: a record moved past the revision this coordinator wrote (job %s at %d, not %d)", ErrFenced, w.id, m.seq, w.rev)
			}
		}
	}
	revs := make([]uint64, len(ws))
	for i, w := range ws {
		var expires time.Time
		var ends int64
		if w.ttl > 0 {
			expires, ends = now.Add(w.ttl), w.expires
		}
		if w.binds() {
			data, _ := json.Marshal(w.bind)
			b.seq++
			b.bindings[bindingKey(w.key)] = memMessage{data: data, seq: b.seq, at: now, expires: expires}
		}
		b.seq++
		b.records[w.id] = memMessage{data: w.data, seq: b.seq, state: w.state, recSeq: w.seq, at: now, expires: expires, ends: ends, unique: w.uniqueUntil, runAt: w.runAt, queue: w.queue}
		revs[i] = b.seq
	}
	return revs, nil
}

func (s *memStore) read(ctx context.Context, id string) ([]byte, error) {
	data, _, err := s.readAt(ctx, id)
	return data, err
}

func (s *memStore) readAt(_ context.Context, id string) ([]byte, uint64, error) {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	m, ok := b.records[id]
	if !ok || !b.live(m, b.clock()) {
		return nil, 0, fmt.Errorf("%w: job %s", errNoRecord, id)
	}
	return m.data, m.seq, nil
}

// load reads every record as the JetStream store reads their headers: finished jobs
// as heads, active ones whole. It never uses a checkpoint, as a recovery after a fence.
func (s *memStore) load(context.Context) (*loaded, error) {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock()
	ld := &loaded{lastSeq: b.seq, coldAfter: math.MaxInt64} // every record whole
	for id, m := range b.records {
		if !b.live(m, now) {
			continue
		}
		h := head{id: id, seq: m.recSeq, state: m.state, at: m.at, expires: m.ends, uniqueUntil: m.unique, due: m.runAt, queue: m.queue}
		if m.state.Active() || m.unique > now.UnixMilli() {
			h = wholeHead(h)
		}
		ld.heads = append(ld.heads, h)
		if m.state.Active() || m.unique > now.UnixMilli() {
			var r protocol.Record
			if err := json.Unmarshal(m.data, &r); err != nil {
				return nil, fmt.Errorf("job %s: %w", id, err)
			}
			ld.records = append(ld.records, stored{Record: r, rev: m.seq, expires: m.ends})
		}
	}
	return ld, nil
}

// bindings hands keep every binding stored, with every; there is no old bucket.
func (s *memStore) bindings(_ context.Context, every bool, keep func(key string, value []byte) bool) error {
	if !every {
		return nil
	}
	b := s.b
	b.mu.Lock()
	now := b.clock()
	var live []storedBinding
	for k, m := range b.bindings {
		if b.live(m, now) {
			live = append(live, storedBinding{k, m.data})
		}
	}
	b.mu.Unlock()
	for _, bd := range live {
		keep(bd.key, bd.value)
	}
	return nil
}

func (s *memStore) checkpoint(_ context.Context, index func() []head) (int, error) {
	s.b.mu.Lock()
	at := s.b.seq
	s.b.mu.Unlock()
	heads := index()
	if heads == nil {
		return 0, nil
	}
	s.b.mu.Lock()
	s.b.index, s.b.indexAt = heads, at
	s.b.mu.Unlock()
	return len(heads), nil
}

func (s *memStore) controls() controlStore { return memControls{s.b} }
