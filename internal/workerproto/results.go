package workerproto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/backoff"
	"github.com/jobbus/jobbus/internal/reuse"
)

// batchBytes bounds the estimated size of one TaskResults, within NATS's default
// maximum payload (1 MiB) even if every character needed escaping as \u00XX; a result
// larger than it goes on its own on PathResult, so that a result that fits in a NATS
// message alone never fails for the batch's few bytes around it.
const batchBytes = 128 << 10

// keptQueue is the most results a Results' emptied queue keeps room for; a larger
// backing array, a burst's, is let go.
const keptQueue = 256

// Results delivers a worker's results (a native worker's, or a TCP worker's through the
// bridge, one Results per session) with group commit: a result that finishes
// while no delivery is in flight goes at once, alone, so an idle worker's latency does
// not grow; results that finish while deliveries are in flight wait and go together in
// the next ask on protocol.PathResults, one ask for many. Each result keeps Deliver's
// rules: it is offered until the coordinator answers it finally (its answer comes once
// its outcome is durable), with a backoff between offers, or until ctx ends (or, with
// DeliverUntil, its own deadline passes).
//
// With a coordinator that does not serve batches (it said no Results when the worker
// registered, or nobody answers on PathResults: an older coordinator leads now), each
// result is delivered on its own with Deliver, as before. Its methods are safe for
// concurrent use; the zero value is not usable: call NewResults.
type Results struct {
	ctx      context.Context // bounds every delivery: the worker's send context
	node     *bus.Node
	workerID string
	retry    backoff.Policy
	inFlight int // most batch asks at once

	max atomic.Int64 // most results in one ask; 0: single results only

	mu      sync.Mutex
	queue   []*pendingResult // waiting for an ask, oldest first
	senders int              // goroutines asking now (at most inFlight)

	asks, sent atomic.Uint64 // batch asks made, and the results they carried

	// pool runs send on reused goroutines, its owner's (NewResults): a fresh one's
	// stack grew, by copying, as each ask's encoding and decoding deepened it (all of a
	// native bench's stack copying). sendTask is r.send made once (a method value
	// per use would be an allocation).
	pool     *reuse.Pool
	sendTask func()

	// free holds pendingResults to reuse, each with its done channel (empty): every
	// result passes through one, and the two cost allocations per job.
	free sync.Pool
}

// pendingResult is one result on its way, and where its outcome goes. Whoever settles
// it sends on done and touches it no more: DeliverUntil then reuses it.
type pendingResult struct {
	res   *protocol.TaskResult
	size  int       // its estimated encoded size
	until time.Time // no offer after it (unless zero)
	tries int       // asks that carried it, by the sender only until done
	err   error     // why its last offer did not settle it, by the sender only
	done  chan delivered
}

// delivered is a pending result's outcome; single: deliver it on its own instead.
type delivered struct {
	ack    protocol.ResultAck
	err    error
	single bool
}

// NewResults returns a deliverer of the results of workerID, with at most inFlight
// batch asks at once (at least 1). Until Serves is told the coordinator takes batches,
// every result goes on its own. The goroutines it starts belong to wg, which its owner
// waits for once ctx ended: they end then, or once idle for reuse.Idle.
func NewResults(ctx context.Context, node *bus.Node, workerID string, retry backoff.Policy, inFlight int, wg *sync.WaitGroup) *Results {
	r := &Results{ctx: ctx, node: node, workerID: workerID, retry: retry, inFlight: max(inFlight, 1)}
	r.pool = reuse.New(ctx.Done(), wg)
	r.sendTask = r.send
	return r
}

// Serves records what the coordinator's WORKER_REGISTERED said it takes in one batch
// (WorkerRegistered.Results; 0 from one that takes single results only).
func (r *Results) Serves(n int) {
	r.max.Store(int64(min(max(n, 0), protocol.MaxResults)))
}

// Counts are the batch asks made and the results they carried.
func (r *Results) Counts() (asks, results uint64) { return r.asks.Load(), r.sent.Load() }

// Deliver offers res until the coordinator answers it finally, as the package's
// Deliver does, and returns the answer, how many asks carried it, and the error that
// ended the offers (nil with an answer).
func (r *Results) Deliver(res *protocol.TaskResult) (ack protocol.ResultAck, tries int, err error) {
	return r.DeliverUntil(res, time.Time{})
}

// DeliverUntil is Deliver, giving up once the next offer would come after until, as
// the package's Deliver does (zero: never), with the error of the last offer. The
// bridge bounds a TCP worker's results so (Config.ResultRetryFor).
func (r *Results) DeliverUntil(res *protocol.TaskResult, until time.Time) (ack protocol.ResultAck, tries int, err error) {
	size := resultSize(res)
	if r.max.Load() == 0 || size > batchBytes {
		return r.single(res, 0, until)
	}
	p := r.pending(res, size, until)
	r.mu.Lock()
	r.queue = append(r.queue, p)
	start := r.senders < r.inFlight
	if start {
		r.senders++
	}
	r.mu.Unlock()
	if start {
		r.pool.Go(r.sendTask)
	}
	d := <-p.done // every pending result is answered: send ends only with an empty queue
	tries = p.tries
	r.release(p)
	if d.single {
		return r.single(res, tries, until)
	}
	return d.ack, tries, d.err
}

// pending is a pendingResult for res, reused if one is free.
func (r *Results) pending(res *protocol.TaskResult, size int, until time.Time) *pendingResult {
	p, _ := r.free.Get().(*pendingResult)
	if p == nil {
		p = &pendingResult{done: make(chan delivered, 1)}
	}
	p.res, p.size, p.until = res, size, until
	return p
}

// release frees p, settled (its outcome received from done), for another result.
func (r *Results) release(p *pendingResult) {
	*p = pendingResult{done: p.done}
	r.free.Put(p)
}

// single delivers res on its own (PathResult), after tries asks of batches.
func (r *Results) single(res *protocol.TaskResult, tries int, until time.Time) (protocol.ResultAck, int, error) {
	data, err := protocol.Encode(res)
	if err != nil {
		return protocol.ResultAck{}, tries, err
	}
	ack, n, err := Deliver(r.ctx, r.node, data, until, r.retry)
	return ack, tries + n, err
}

// send asks batches while results wait, then ends. Results an ask did not settle wait
// a backoff (which grows while asks keep failing) and go first in the next ask; one
// whose deadline would pass meanwhile ends with its last offer's error.
func (r *Results) send() {
	b := r.retry.Start()
	for {
		batch := r.take()
		if batch == nil {
			return
		}
		again := r.ask(batch)
		if len(again) == 0 {
			b.Reset()
			continue
		}
		delay := b.Next()
		again = expire(again, time.Now().Add(delay))
		if len(again) == 0 {
			continue
		}
		if !backoff.Sleep(r.ctx, delay) {
			err := r.ctx.Err()
			for _, p := range again {
				p.done <- delivered{err: err}
			}
			continue // the results still queued fail the same way, at once
		}
		r.mu.Lock()
		r.queue = append(again, r.queue...)
		r.mu.Unlock()
	}
}

// expire settles the results of again whose deadline is before next, the time of
// their next offer, and returns the others.
func expire(again []*pendingResult, next time.Time) []*pendingResult {
	keep := again[:0]
	for _, p := range again {
		if !p.until.IsZero() && next.After(p.until) {
			p.done <- delivered{err: p.err}
			continue
		}
		keep = append(keep, p)
	}
	return keep
}

// take removes the next batch from the queue: the oldest results, as many as the
// coordinator takes within batchBytes (one at least). It returns nil, and the sender
// ends, when the queue is empty.
func (r *Results) take() []*pendingResult {
	limit := int(r.max.Load())
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.queue) == 0 || limit == 0 {
		for _, p := range r.queue { // the coordinator turned out to take single results only
			p.done <- delivered{single: true}
		}
		r.queue = nil
		r.senders--
		return nil
	}
	n, size := 0, 0
	for n < len(r.queue) && (n == 0 || n < limit && size+r.queue[n].size <= batchBytes) { // each is at most batchBytes
		size += r.queue[n].size
		n++
	}
	batch := make([]*pendingResult, n)
	copy(batch, r.queue)
	clear(r.queue[:n])
	switch {
	case n < len(r.queue):
		r.queue = r.queue[n:]
	case cap(r.queue) <= keptQueue:
		r.queue = r.queue[:0] // emptied at nearly every ask: kept for the next results
	default:
		r.queue = nil // let a burst's backing array go
	}
	return batch
}

// ask offers a batch once and settles each result it answers finally; it returns the
// others, to be offered again.
func (r *Results) ask(batch []*pendingResult) (again []*pendingResult) {
	if err := r.ctx.Err(); err != nil {
		for _, p := range batch {
			p.done <- delivered{err: err}
		}
		return nil
	}
	req := &protocol.TaskResults{WorkerID: r.workerID, Results: make([]protocol.TaskResult, len(batch))}
	for i, p := range batch {
		req.Results[i] = *p.res
		p.tries++
	}
	r.asks.Add(1)
	r.sent.Add(uint64(len(batch)))
	acks, err := bus.Ask[protocol.ResultAcks](r.ctx, r.node, Coordinator, protocol.PathResults, req)
	switch {
	case errors.Is(err, bus.ErrNoPeer):
		return r.probe(batch)
	case err != nil && Final(err):
		for _, p := range batch {
			p.done <- delivered{err: err}
		}
		return nil
	case err != nil:
		return failed(batch, err)
	case len(acks.Acks) != len(batch):
		// Not an answer to this batch: offered again, as a garbled answer is.
		return failed(batch, fmt.Errorf("%s answered %d results of %d", protocol.PathResults, len(acks.Acks), len(batch)))
	}
	for i, p := range batch {
		a := acks.Acks[i]
		if a.Code == 0 {
			p.done <- delivered{ack: protocol.ResultAck{JobID: a.JobID, Accepted: a.Accepted}}
			continue
		}
		err := &bus.RemoteError{Path: protocol.PathResults, Code: bus.Code(a.Code), Message: a.Error}
		if Final(err) {
			p.done <- delivered{err: err}
			continue
		}
		p.err = err
		again = append(again, p)
	}
	return again
}

// failed notes err as why the results of batch were not settled, and returns batch.
func failed(batch []*pendingResult, err error) []*pendingResult {
	for _, p := range batch {
		p.err = err
	}
	return batch
}

// probe finds out why nobody served a batch: no coordinator leads (a failover, a
// restart), or one leads that takes single results only (an older one). It offers the
// batch's first result on its own, once: with nobody there either, the batch is
// offered again after the backoff, as any unanswered one; otherwise the results go on
// their own from now on, until a registration says the coordinator takes batches.
func (r *Results) probe(batch []*pendingResult) (again []*pendingResult) {
	first := batch[0]
	first.tries++
	data, err := protocol.Encode(first.res)
	if err != nil {
		first.done <- delivered{err: err}
		return batch[1:]
	}
	ack, err := bus.Ask[protocol.ResultAck](r.ctx, r.node, Coordinator, protocol.PathResult, json.RawMessage(data))
	if !Final(err) {
		// Nobody there either, or a coordinator that cannot serve now (one starting or
		// stopping): nothing is learnt.
		return failed(batch, err)
	}
	// A coordinator answered a single result finally where none served the batch: it
	// takes single results only (a coordinator serves the batch path before the single
	// one, api.go).
	r.max.Store(0)
	first.done <- delivered{ack: ack, err: err}
	for _, p := range batch[1:] {
		p.done <- delivered{single: true}
	}
	return nil
}

// resultSize estimates res's encoded size in a batch.
func resultSize(res *protocol.TaskResult) int {
	n := 160 + len(res.WorkerID) + len(res.JobID) + len(res.AttemptID)
	if res.Result != nil {
		n += len(*res.Result)
	}
	if res.Error != nil {
		n += len(*res.Error)
	}
	return n
}
