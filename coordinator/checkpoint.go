package coordinator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
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

const (
	checkpointObject    = "index"
	checkpointMagic     = "jobbus-index-2\n"
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

// countWrite counts a durable write and starts a checkpoint when enough were made
// since the last. Called with c.mu held.
func (c *Coordinator) countWrite() {
	c.sinceCheckpoint++
	if c.checkpointing || c.runCtx == nil || c.sinceCheckpoint < max(minCheckpointWrites, len(c.index.entries)) {
		return
	}
	c.checkpointing = true
	c.goRun(func() {
		if err := c.checkpoint(c.runCtx); err != nil && c.runCtx.Err() == nil {
			c.log.Warn("checkpoint not written; a restart reads every record's headers", "err", err)
		}
		c.mu.Lock()
		c.checkpointing = false
		c.unlock()
	})
}

// finalCheckpoint writes a checkpoint as the coordinator stops, so that the next start
// reads little but it. A fenced coordinator writes none: its memory is not the truth.
func (c *Coordinator) finalCheckpoint() {
	c.mu.Lock()
	skip := !c.opened || c.fenced != nil || c.checkpointing || !c.lease.held()
	c.checkpointing = true
	c.unlock()
	if skip {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.checkpoint(ctx); err != nil {
		c.log.Warn("checkpoint not written at stop; the next start reads every record's headers", "err", err)
	}
}

// checkpoint writes the index as of the stream's current last sequence.
func (c *Coordinator) checkpoint(ctx context.Context) error {
	_, err := c.store.checkpoint(ctx, func() []head {
		c.mu.Lock()
		defer c.unlock()
		if c.fenced != nil {
			return nil
		}
		c.sinceCheckpoint = 0
		return c.heads()
	})
	return err
}

// heads copies the index: finished jobs whole, active ones (state "") to be read.
// The ids are written into one string, which they slice: a million small strings would
// cost a million allocations while c.mu is held. Called with c.mu held.
func (c *Coordinator) heads() []head {
	exp := make(map[uint64]int64, len(c.expiring)-c.expHead)
	for _, x := range c.expiring[c.expHead:] {
		exp[x.seq] = x.at
	}
	n := len(c.index.entries) - c.index.holes
	hs := make([]head, 0, n)
	ids := make([]byte, 0, 36*n)
	ends := make([]int, 0, n)
	for i := range c.index.entries {
		e := &c.index.entries[i]
		if !e.live() {
			continue
		}
		ids = c.index.appendID(ids, e)
		ends = append(ends, len(ids))
		if e.j != nil {
			hs = append(hs, head{seq: e.seq})
			continue
		}
		h := head{seq: e.seq, state: e.state(), expires: exp[e.seq]}
		if k := c.index.key(e); k != "" {
			if d, ok := c.doneKeys[k]; ok && c.index.hasID(e, d.jobID) {
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
		uvarint(uint64(h.expires))
		str(h.id)
		str(h.key)
		str(h.fingerprint)
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
		protocol.StateCompleted, protocol.StateFailed, protocol.StateCancelled}
	stateCode = func() map[protocol.State]byte {
		m := make(map[protocol.State]byte, len(codeState))
		for i, s := range codeState {
			m[s] = byte(i)
		}
		return m
	}()
)
