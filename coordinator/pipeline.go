package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A pipeline writes jobs to the JOBS stream without waiting for one acknowledgement
// before sending the next write: where writes are not batched (a single server that
// does not sync each write), a round trip per write in a pool of goroutines cost
// a context, a timer and a goroutine switch per write. Each job still has at most one
// write in flight (the committer), so writes of different jobs may land in any order and
// each remains a CAS on the revision its predecessor returned. Acknowledgements come
// to one subscription, whose callback settles the write: a success is recorded at
// once; a failure goes to commit, which retries it the way a single write is retried.
type pipeline struct {
	s      *jsStore
	ctx    context.Context // ends when writing stops
	prefix string          // reply subjects are prefix + the write's number
	slots  chan struct{}   // one per write in flight
	sub    *nats.Subscription

	next atomic.Uint64 // the last write's number

	mu     sync.Mutex
	flying map[uint64]*flight

	// acked are the writes stored whose acknowledgements came in one burst (only the
	// subscription's callback touches it): they are recorded together once no more
	// acknowledgements wait, so that the assignments they release leave together.
	acked []ackedFlight
	ws    []ackedWrite // settleAcked's buffer: writtenAll keeps none of it
}

// ackedFlight is a write JetStream stored at seq, not yet recorded; its flight stays
// in flying until then (expire still settles it if it must).
type ackedFlight struct {
	id  uint64
	seq uint64
}

// ackBurst is the most acknowledgements recorded together.
const ackBurst = 64

// flight is one job's write in flight: its messages are sent one after the other,
// each once the one before it is stored (a binding before the record that ends the
// job, as messages orders them).
type flight struct {
	w     pendingWrite
	msgs  []*nats.Msg // what is left to send, the one in flight first
	start time.Time
	sent  time.Time // when msgs[0] went
	// reply is the subject its acknowledgements come to: the pipeline's prefix and
	// its number. It and the record's message are made with the flight: a write
	// took six allocations for them, and takes four.
	reply string
	rec   recordMessage
}

// writeTimeout is how long a write may go unacknowledged before it counts as failed
// (its outcome unknown: commit retries it, and a CAS that finds it landed fences).
const writeTimeout = 5 * time.Second

// start subscribes to the acknowledgements. Writes may be in flight up to the
// coordinator's Writers.
func (p *pipeline) start(ctx context.Context) error {
	p.ctx, p.prefix = ctx, p.s.nc.NewRespInbox()+"."
	p.slots = make(chan struct{}, p.s.cfg.Writers)
	p.flying = make(map[uint64]*flight)
	sub, err := p.s.nc.Subscribe(p.prefix+"*", p.acknowledged)
	if err != nil {
		return fmt.Errorf("write acknowledgements: %w", err)
	}
	// Acknowledgements must never be dropped as a slow consumer's: the slots bound
	// how many can be pending.
	_ = sub.SetPendingLimits(-1, -1)
	p.sub = sub
	p.s.goRun(p.expire)
	return nil
}

// write sends each of ws, without waiting for one acknowledgement before sending the
// next; it returns false once ctx ended (the writes not sent failed).
func (p *pipeline) write(ctx context.Context, ws []pendingWrite) bool {
	for i, w := range ws {
		if !p.send(w) {
			for _, w := range ws[i+1:] {
				p.s.sink.fail(w.j, ctx.Err())
			}
			return false
		}
	}
	return true
}

// send starts w's write, once a slot is free. It returns false when ctx ended first.
func (p *pipeline) send(w pendingWrite) bool {
	select {
	case p.slots <- struct{}{}:
	case <-p.ctx.Done():
		p.s.sink.fail(w.j, p.ctx.Err())
		return false
	}
	f := &flight{w: w, start: time.Now()}
	id := p.next.Add(1)
	var buf [64]byte
	f.msgs, f.reply = p.s.messagesIn(&f.rec, &f.w, strconv.AppendUint(append(buf[:0], p.prefix...), id, 36))
	p.mu.Lock()
	p.flying[id] = f
	p.mu.Unlock()
	p.publish(id, f)
	return true
}

// publish sends f's next message; a failure to send settles the write.
func (p *pipeline) publish(id uint64, f *flight) {
	p.mu.Lock()
	f.sent = time.Now()
	p.mu.Unlock()
	m := f.msgs[0]
	m.Reply = f.reply
	if err := p.s.nc.PublishMsg(m); err != nil {
		if p.take(id) != nil {
			p.settle(f, 0, err)
		}
	}
}

// take removes write id from the flights, if it is still there.
func (p *pipeline) take(id uint64) *flight {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.flying[id]
	delete(p.flying, id)
	return f
}

// pubAck is JetStream's acknowledgement of one stored message, read as nats.go reads
// it (jetstream's pubAckResponse): the PubAck, or the API's error.
type pubAck struct {
	jetstream.PubAck
	Error *jetstream.APIError `json:"error,omitempty"`
}

// acknowledged is the subscription's callback: it runs one acknowledgement at a time.
// The writes stored are recorded once no acknowledgement waits behind this one (or
// ackBurst of them are), all together: nothing waits that has not already arrived.
func (p *pipeline) acknowledged(m *nats.Msg) {
	p.acknowledge(m)
	if len(p.acked) == 0 {
		return
	}
	// nats.go counts the message being delivered as pending until its callback returns.
	if n, _, err := m.Sub.Pending(); err == nil && n > 1 && len(p.acked) < ackBurst {
		return // the next callback comes at once
	}
	p.settleAcked()
}

// acknowledge reads one acknowledgement: a write stored joins acked; any other
// outcome settles its write at once.
func (p *pipeline) acknowledge(m *nats.Msg) {
	id, err := strconv.ParseUint(m.Subject[len(p.prefix):], 36, 64)
	if err != nil {
		return
	}
	seq, plain := ackSeq(m.Data)
	switch {
	case len(m.Data) == 0: // a status message: no stream answered
		err = jetstream.ErrNoStreamResponse
	case !plain:
		seq, err = decodeAck(m.Data)
	}
	if err == nil && p.sendNext(id) {
		return
	}
	if err == nil {
		p.acked = append(p.acked, ackedFlight{id, seq})
		return
	}
	if f := p.take(id); f != nil { // else expired meanwhile: commit has retried it
		p.settle(f, seq, err)
	}
}

// settleAcked records the writes in acked, all at once (storeSink.writtenAll).
func (p *pipeline) settleAcked() {
	ws := p.ws[:0]
	for _, a := range p.acked {
		f := p.take(a.id)
		if f == nil { // expired meanwhile: commit has retried it
			continue
		}
		<-p.slots
		p.s.noteStored(f.w.j, f.start, nil)
		ws = append(ws, ackedWrite{f.w.j, a.seq, f.w.version})
	}
	p.acked = p.acked[:0]
	if len(ws) > 0 {
		p.s.sink.writtenAll(ws)
	}
	clear(ws) // drop the jobs
	p.ws = ws[:0]
}

// decodeAck reads an acknowledgement other than a plain one (ackSeq) with
// encoding/json: the API's error, or the sequence.
func decodeAck(data []byte) (uint64, error) {
	var ack pubAck
	switch {
	case json.Unmarshal(data, &ack) != nil:
		return 0, fmt.Errorf("bad acknowledgement %q", data)
	case ack.Error != nil:
		return 0, ack.Error
	}
	return ack.Sequence, nil
}

// ackSeq reads the sequence of a plain acknowledgement as nats-server writes it,
// {"stream":"KV_JOBS","seq":42} (with "domain":"..." between the two where the server
// has a domain), without encoding/json (7 allocations and about 2 µs a write). ok is
// false for anything else, an error, a duplicate or a batch's, which json.Unmarshal
// reads.
func ackSeq(data []byte) (seq uint64, ok bool) {
	rest, ok := bytes.CutPrefix(data, []byte(`{"stream":`))
	if !ok {
		return 0, false
	}
	if rest, ok = skipPlainString(rest); !ok {
		return 0, false
	}
	if r, found := bytes.CutPrefix(rest, []byte(`,"domain":`)); found {
		if rest, ok = skipPlainString(r); !ok {
			return 0, false
		}
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"seq":`)); !ok {
		return 0, false
	}
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	// 19 digits never overflow; a leading zero is not JSON.
	if n == 0 || n > 19 || (rest[0] == '0' && n > 1) || string(rest[n:]) != "}" {
		return 0, false
	}
	for _, c := range rest[:n] {
		seq = seq*10 + uint64(c-'0')
	}
	return seq, true
}

// skipPlainString skips a JSON string without escapes or control characters at the
// start of b.
func skipPlainString(b []byte) ([]byte, bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, false
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return b[i+1:], true
		case c == '\\' || c < 0x20:
			return nil, false
		}
	}
	return nil, false
}

// sendNext sends the next message of write id, if it has one left.
func (p *pipeline) sendNext(id uint64) bool {
	p.mu.Lock()
	f := p.flying[id]
	more := f != nil && len(f.msgs) > 1
	if more {
		f.msgs = f.msgs[1:]
	}
	p.mu.Unlock()
	if more {
		p.publish(id, f)
	}
	return more
}

// settle ends f's flight: a stored record is written; a failure goes to commit,
// which classifies it (fenced, store full, permanent) and retries what it can.
func (p *pipeline) settle(f *flight, rev uint64, err error) {
	<-p.slots
	s := p.s
	s.noteStored(f.w.j, f.start, err)
	if err != nil {
		s.oc.note([]pendingWrite{f.w}, err) // outcome.go
	}
	switch {
	case err == nil:
		s.sink.written(f.w.j, rev, f.w.version)
	case errors.Is(err, nats.ErrConnectionClosed) || p.ctx.Err() != nil:
		s.oc.abandon([]pendingWrite{f.w}, false, err)
	default:
		s.goRun(func() {
			if !s.gaveUpCreate(p.ctx, f.w, err) { // storage.go
				s.commit(p.ctx, []pendingWrite{f.w})
			}
		})
	}
}

// expire fails writes whose acknowledgement is overdue, and every write left in flight
// when the committers stop.
func (p *pipeline) expire() {
	tick := time.NewTicker(writeTimeout / 5)
	defer tick.Stop()
	for {
		select {
		case <-p.ctx.Done():
			_ = p.sub.Unsubscribe()
			// Settled together: each may read the store back, under one deadline.
			var ws []pendingWrite
			for _, f := range p.overdue(time.Time{}) {
				<-p.slots
				p.s.noteStored(f.w.j, f.start, p.ctx.Err())
				ws = append(ws, f.w)
			}
			if len(ws) > 0 {
				p.s.oc.note(ws, p.ctx.Err())
				p.s.oc.abandon(ws, false, p.ctx.Err())
			}
			return
		case now := <-tick.C:
			wait := writeTimeout
			if p.s.storage.failing() != nil { // storage.go: no acknowledgement is coming
				wait = writeTimeout / 5
			}
			for _, f := range p.overdue(now.Add(-wait)) {
				p.settle(f, 0, fmt.Errorf("%w: no acknowledgement within %v", context.DeadlineExceeded, wait))
			}
			if p.oldest(now.Add(-slowWriteAfter)) {
				p.s.storage.slowWrite(slowWriteAfter) // outcome.go
			}
		}
	}
}

// oldest reports whether a flight's message went before cutoff.
func (p *pipeline) oldest(cutoff time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.flying {
		if f.sent.Before(cutoff) {
			return true
		}
	}
	return false
}

// overdue takes the flights whose message went before cutoff; all of them for zero.
func (p *pipeline) overdue(cutoff time.Time) []*flight {
	p.mu.Lock()
	defer p.mu.Unlock()
	var late []*flight
	for id, f := range p.flying {
		if cutoff.IsZero() || f.sent.Before(cutoff) {
			late = append(late, f)
			delete(p.flying, id)
		}
	}
	return late
}
