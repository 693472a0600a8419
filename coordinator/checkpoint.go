package coordinator

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// A checkpoint is the job index as of a sequence S of the JOBS stream, so that a
// restart reads it and then only what was written after S, instead of the headers of
// every record: finished jobs as their entries (sequence, id, state, end of retention,
// idempotency binding), active ones by id, to be read whole. It is written when the
// coordinator stops and, while it runs, once the writes since the last one are as many
// as the jobs it keeps (at least minCheckpointWrites), in an object store.
//
// S is the stream's last sequence read before the index is copied: a write at or below
// S landed before the copy, and either shows in it (a finished job retires only once its
// write is acknowledged) or belongs to a job the copy lists as active, which is read
// whole. Writes after S are read again. A checkpoint counts only in the term after the
// one that wrote it: a deposed leader's checkpoint, or one older than a term that wrote
// none, is ignored, as after a fence, when memory was not the truth.

// checkpointMagic begins a checkpoint. It was jobbus-index-2 before checkpoints listed
// far SCHEDULED jobs holding a unique key as jobs to read whole, and jobbus-index-3
// before they named the queue of each far SCHEDULED job: such a checkpoint, left by an
// older release, is not read (recovery reads every record's headers once), since it
// would hide those jobs' keys, or leave their queues unknown.
const (
	checkpointObject    = "index"
	checkpointMagic     = "jobbus-index-4\n"
	minCheckpointWrites = 50_000
)

// openCheckpoints opens the checkpoint bucket.
func openCheckpoints(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.ObjectStore, error) {
	store, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: protocol.CheckpointBucket, Description: "jobbus job index checkpoints",
		Storage: jetstream.FileStorage, Replicas: replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", protocol.CheckpointBucket, err)
	}
	return store, nil
}

// checkpointer writes checkpoints of the job index through the store: once the
// durable writes since the last are as many as the jobs kept (at least
// minCheckpointWrites), and as the coordinator stops. It owns the count, the one
// checkpoint in flight and the goroutine that writes it. Its state is atomic: count is
// called for every durable write with the scheduler's mu held, and must not lengthen
// that critical section by more than an increment.
type checkpointer struct {
	store jobStore
	log   *slog.Logger
	// index returns the index as it stands and resets the count, under the scheduler's
	// lock; nil when the coordinator is fenced, whose memory is not the truth.
	index func() []head

	ctx     atomic.Pointer[context.Context] // set once serving: from then on, writes may start checkpoints
	since   atomic.Int64                    // durable writes since the last checkpoint
	running atomic.Bool                     // a checkpoint is being written
	wg      sync.WaitGroup
}

// begin lets writes start checkpoints, until ctx ends.
func (k *checkpointer) begin(ctx context.Context) { k.ctx.Store(&ctx) }

// count counts a durable write and starts a checkpoint when enough were made since
// the last, kept being the jobs the index holds.
func (k *checkpointer) count(kept int) {
	if k.since.Add(1) < int64(max(minCheckpointWrites, kept)) {
		return
	}
	p := k.ctx.Load()
	if p == nil || !k.running.CompareAndSwap(false, true) {
		return
	}
	ctx := *p
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		if err := k.write(ctx); err != nil && ctx.Err() == nil {
			k.log.Warn("checkpoint not written; a restart reads every record's headers", "err", err)
		}
		k.running.Store(false)
	}()
}

// reset starts counting again, as a checkpoint copies the index.
func (k *checkpointer) reset() { k.since.Store(0) }

// final writes a checkpoint as the coordinator stops, so that the next start reads
// little but it, unless ok is false (nothing opened, fenced, or the lease not
// certainly held) or one is being written. No checkpoint starts after it.
func (k *checkpointer) final(ok bool) {
	if busy := k.running.Swap(true); busy || !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.write(ctx); err != nil {
		k.log.Warn("checkpoint not written at stop; the next start reads every record's headers", "err", err)
	}
}

// wait returns once no checkpoint is being written.
func (k *checkpointer) wait() { k.wg.Wait() }

// write writes the index as of the store's last write.
func (k *checkpointer) write(ctx context.Context) error {
	_, err := k.store.checkpoint(ctx, k.index)
	return err
}

// indexCopy is the checkpointer's copy of the index: nil once fenced. It resets the
// checkpointer's count under s.mu, so that no write counted after the copy is lost.
func (s *scheduler) indexCopy() []head {
	s.mu.Lock()
	defer s.unlock()
	if s.fenced != nil {
		return nil
	}
	s.ckpt.reset()
	return s.kept.heads()
}

// heads copies the index: finished jobs whole, active ones (state "") to be read, with
// their idempotency keys.
// The ids are written into one string, which they slice: a million small strings would
// cost a million allocations while the scheduler's mu is held. Called with the scheduler's mu held.
func (rt *retention) heads() []head {
	exp := make(map[uint64]int64, len(rt.expiring)-rt.expHead)
	for _, x := range rt.expiring[rt.expHead:] {
		exp[x.seq] = x.at
	}
	due := rt.s.delayed.coldDue()
	n := len(rt.index.entries) - rt.index.holes
	hs := make([]head, 0, n)
	ids := make([]byte, 0, 36*n)
	ends := make([]int, 0, n)
	for i := range rt.index.entries {
		e := &rt.index.entries[i]
		if !e.live() {
			continue
		}
		ids = rt.index.appendID(ids, e)
		ends = append(ends, len(ids))
		if e.j != nil {
			// Its key goes too: should its finishing write straddle the checkpoint's
			// sequence (a binding stored before it, the record after), the replay
			// finds it finished and no later binding (jsStore.replay).
			hs = append(hs, head{seq: e.seq, key: e.j.rec.IdempotencyKey, fingerprint: e.j.rec.Fingerprint})
			continue
		}
		h := head{seq: e.seq, state: e.state(), expires: exp[e.seq], due: due[e.seq]}
		if h.state == protocol.StateScheduled {
			h.queue = rt.index.queue(e)
		}
		if k := rt.index.key(e); k != "" {
			if d, ok := rt.doneKeys[k]; ok && rt.index.hasID(e, d.jobID) {
				h.key, h.fingerprint = k, d.fingerprint
			}
		}
		hs = append(hs, h)
	}
	all, start := string(ids), 0
	for i := range hs {
		hs[i].id = all[start:ends[i]]
		start = ends[i]
	}
	rt.s.uniq.readWhole(hs) // finished jobs that hold a unique window (unique.go)
	return hs
}

func encodeCheckpoint(term, at uint64, heads []head) []byte {
	var buf bytes.Buffer
	buf.Grow(len(checkpointMagic) + 30 + len(heads)*50)
	buf.WriteString(checkpointMagic)
	var tmp [binary.MaxVarintLen64]byte
	uvarint := func(v uint64) { buf.Write(tmp[:binary.PutUvarint(tmp[:], v)]) }
	str := func(s string) { uvarint(uint64(len(s))); buf.WriteString(s) }
	uvarint(term)
	uvarint(at)
	uvarint(uint64(len(heads)))
	for _, h := range heads {
		uvarint(h.seq)
		buf.WriteByte(stateCode[h.state])
		end := h.expires
		if h.state == protocol.StateScheduled { // no end of retention, but a due time
			end = h.due
		}
		uvarint(uint64(end))
		str(h.id)
		str(h.key)
		str(h.fingerprint)
		if h.state == protocol.StateScheduled { // its queue, "" for the default
			q := h.queue
			if q == protocol.DefaultQueue {
				q = ""
			}
			str(q)
		}
	}
	return buf.Bytes()
}

// errBadCheckpoint: the checkpoint cannot be read; recovery reads every record instead.
var errBadCheckpoint = errors.New("unreadable checkpoint")

func decodeCheckpoint(data []byte) (term, at uint64, heads []head, err error) {
	// One string for the whole checkpoint, which ids and keys slice: a million small
	// strings would cost a million allocations.
	d := checkpointReader{s: string(data)}
	if !strings.HasPrefix(d.s, checkpointMagic) {
		return 0, 0, nil, errBadCheckpoint
	}
	d.pos = len(checkpointMagic)
	term, at = d.uvarint(), d.uvarint()
	n := d.uvarint()
	if d.bad || n > uint64(len(data)) {
		return 0, 0, nil, errBadCheckpoint
	}
	heads = make([]head, n)
	for i := range heads {
		h := &heads[i]
		h.seq = d.uvarint()
		code := d.byte()
		h.expires = int64(d.uvarint())
		h.id, h.key, h.fingerprint = d.str(), d.str(), d.str()
		if d.bad || int(code) >= len(codeState) {
			return 0, 0, nil, errBadCheckpoint
		}
		h.state = codeState[code]
		if h.state == protocol.StateScheduled {
			h.due, h.expires = h.expires, 0
			h.queue = cmp.Or(d.str(), protocol.DefaultQueue)
			if d.bad {
				return 0, 0, nil, errBadCheckpoint
			}
		}
	}
	return term, at, heads, nil
}

// checkpointReader reads a checkpoint; bad is set once anything was out of bounds.
type checkpointReader struct {
	s   string
	pos int
	bad bool
}

func (r *checkpointReader) uvarint() uint64 {
	var v uint64
	for shift := 0; shift < 64 && r.pos < len(r.s); shift += 7 {
		b := r.s[r.pos]
		r.pos++
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v
		}
	}
	r.bad = true
	return 0
}

func (r *checkpointReader) byte() byte {
	if r.pos >= len(r.s) {
		r.bad = true
		return 0
	}
	r.pos++
	return r.s[r.pos-1]
}

func (r *checkpointReader) str() string {
	n := r.uvarint()
	if r.bad || n > uint64(len(r.s)-r.pos) {
		r.bad = true
		return ""
	}
	out := r.s[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return out
}

// State codes in a checkpoint; "" is an active job, read whole.
var (
	codeState = []protocol.State{"", protocol.StateQueued, protocol.StateRunning, protocol.StateRetryWait,
		protocol.StateCompleted, protocol.StateFailed, protocol.StateCancelled, protocol.StateScheduled, protocol.StateWaiting}
	stateCode = func() map[protocol.State]byte {
		m := make(map[protocol.State]byte, len(codeState))
		for i, s := range codeState {
			m[s] = byte(i)
		}
		return m
	}()
)
