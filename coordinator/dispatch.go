package coordinator

import (
	"fmt"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Dispatch: which job starts on which worker. A pass (schedule) repeatedly takes the
// worker with the most free slots (ties by id), and that worker takes the job its
// queues offer: by weight (smooth weighted round robin, deterministic: with all its
// queues full, weights 6:3:1 give exactly 6, 3 and 1 starts of every 10), or in strict
// order (the first of its queues with a job it can start). A queue offers nothing while
// paused or at its max running; within it, each task type the worker serves that is
// below its concurrency limit and admitted by flow control (rate limits, flow.go)
// offers the job of the key whose turn it is (queue.go), and the best of those starts.
// A worker that finds nothing sits the rest of the pass out, so a pass ends.

// queueOf is the name of j's queue: "" in the record is the default one.
func queueOf(j *job) string { return protocol.QueueOf(j.rec.Queue) }

// keyOf is j's concurrency key; "" for none.
func keyOf(j *job) string { return j.rec.ConcurrencyKey }

// agingFrom is when j began to wait (Record.AgingFrom).
func agingFrom(j *job) int64 { return j.rec.AgingFrom() }

// servedQueue is a queue a worker serves, its weight, and its smooth weighted round
// robin credit.
type servedQueue struct {
	name    string
	weight  int
	current int
}

// defaultQueues is what a worker that names no queues serves.
var defaultQueues = []protocol.QueueWeight{{Name: protocol.DefaultQueue, Weight: 1}}

// servedQueues is the queues of a registration, in its order.
func servedQueues(req *protocol.WorkerRegister) []servedQueue {
	qs := req.Queues
	if len(qs) == 0 {
		qs = defaultQueues
	}
	out := make([]servedQueue, len(qs))
	for i, q := range qs {
		out[i] = servedQueue{name: q.Name, weight: q.Weight}
	}
	return out
}

// serves reports whether w takes jobs of the queue named name.
func (w *worker) serves(name string) bool {
	for _, q := range w.queues {
		if q.name == name {
			return true
		}
	}
	return false
}

// served makes the queues w serves known: a queue exists from its first use.
func (r *readyQueue) served(w *worker) {
	for _, q := range w.queues {
		r.queue(q.name)
	}
}

// freest returns the worker with the most free slots, ties by id, among those that
// have not found nothing in this pass.
func (reg *registry) freest(round uint64) *worker {
	var best *worker
	for _, w := range reg.workers {
		free := w.free()
		if free <= 0 || w.idleRound == round {
			continue
		}
		if best == nil || free > best.free() || (free == best.free() && w.id < best.id) {
			best = w
		}
	}
	return best
}

// jobFor returns the job w takes next, or nil when none of its queues offers one.
func (s *scheduler) jobFor(w *worker, now time.Time) *job {
	qs := w.queues
	if len(qs) == 1 {
		return s.offer(s.ready.queues[qs[0].name], w, now)
	}
	if w.strict {
		for i := range qs {
			if j := s.offer(s.ready.queues[qs[i].name], w, now); j != nil {
				return j
			}
		}
		return nil
	}
	var pick *servedQueue
	var picked *job
	total := 0
	for i := range qs {
		e := &qs[i]
		j := s.offer(s.ready.queues[e.name], w, now)
		if j == nil {
			continue
		}
		e.current += e.weight
		total += e.weight
		if pick == nil || e.current > pick.current {
			pick, picked = e, j
		}
	}
	if pick != nil {
		pick.current -= total
	}
	return picked
}

// offer returns the job q offers worker w now, or nil.
func (s *scheduler) offer(q *jobQueue, w *worker, now time.Time) *job {
	if q == nil || q.size == 0 || q.settings.Paused {
		return nil
	}
	if q.settings.MaxRunning > 0 && q.running >= q.settings.MaxRunning {
		s.throttled(q)
		return nil
	}
	var best *job
	bestEff := -1
	for taskType, tl := range q.byType {
		if tl.size == 0 || !w.runs(taskType) {
			continue
		}
		opts := s.cat.options(taskType)
		if opts.Concurrency > 0 && s.route.typeRuns[taskType] >= opts.Concurrency {
			continue
		}
		if !s.admitted(q.name, taskType, now) {
			s.throttled(q)
			continue
		}
		kl := tl.front(keyLimit(q, opts))
		if kl == nil {
			continue
		}
		j, eff := kl.best(now, s.cfg.AgingStep)
		if j != nil && (eff > bestEff || (eff == bestEff && waitedLonger(j, best))) {
			best, bestEff = j, eff
		}
	}
	return best
}

// keyLimit is how many RUNNING jobs one concurrency key may have in q, for a task
// type with options opts: the type's KeyConcurrency, else the queue's; 0 is unbounded.
func keyLimit(q *jobQueue, opts protocol.TaskTypeOptions) int {
	if opts.KeyConcurrency > 0 {
		return opts.KeyConcurrency
	}
	return q.settings.KeyConcurrency
}

// laneLimit is keyLimit for a type lane.
func (s *scheduler) laneLimit(tl *typeLane) int {
	return keyLimit(tl.q, s.cat.options(tl.taskType))
}

// throttled counts, once per pass, that a limit held q's next job back.
func (s *scheduler) throttled(q *jobQueue) {
	if q.throttledRound != s.ready.round {
		q.throttledRound = s.ready.round
		q.throttled++
	}
}

// queueStarted counts j's new attempt against its queue and key (routing.leaseStarted).
func (r *readyQueue) queueStarted(j *job) {
	q := r.queue(queueOf(j))
	q.running++
	if k := keyOf(j); k != "" {
		q.keyRuns[k]++
	}
}

// queueEnded stops counting j's attempt (routing.leaseEnded); its key takes turns
// again if it was at its limit.
func (s *scheduler) queueEnded(j *job) {
	q := s.ready.queue(queueOf(j))
	q.running--
	k := keyOf(j)
	if k == "" {
		return
	}
	if n := q.keyRuns[k] - 1; n > 0 {
		q.keyRuns[k] = n
	} else {
		delete(q.keyRuns, k)
	}
	q.unpark(k, s.laneLimit)
}

// queueFields checks a submission's queue and concurrency key, and completes them:
// the default queue is written as none (""), and a task type whose options name a
// JSON Pointer takes the key from the payload when the submission names none.
func (rt *routing) queueFields(req *protocol.SubmitJob) *protocol.Error {
	if req.Queue != "" {
		if err := protocol.CheckQueueName(req.Queue); err != nil {
			return &protocol.Error{Message: "Invalid queue: " + err.Error()}
		}
		if req.Queue == protocol.DefaultQueue {
			req.Queue = ""
		}
	}
	if req.ConcurrencyKey != "" {
		if err := protocol.CheckConcurrencyKey(req.ConcurrencyKey); err != nil {
			return &protocol.Error{Message: "Invalid concurrency key: " + err.Error()}
		}
		return nil
	}
	if ptr := rt.cat.options(req.TaskType).ConcurrencyKey; ptr != "" {
		key, err := protocol.ConcurrencyKeyAt(req.Payload, ptr)
		if err != nil {
			return protocol.InvalidPayload(fmt.Sprintf("task type %s takes its concurrency key from the payload at %s: %v", req.TaskType, ptr, err))
		}
		req.ConcurrencyKey = key
	}
	return nil
}

// collectEvery is how often idle queues are forgotten: a queue with no job not yet
// finished (none SCHEDULED, WAITING, QUEUED, RUNNING or in RETRY_WAIT), no stored
// settings and no worker serving it, into which no job came for a whole period, is
// dropped from memory (its counters with it); its next use makes it again.
const collectEvery = time.Minute

// collect forgets idle queues, at most once per collectEvery. Called with the
// scheduler's mu held.
func (r *readyQueue) collect(now time.Time, reg *registry) {
	if now.Sub(r.collected) < collectEvery {
		return
	}
	r.collected = now
	for _, q := range r.queues {
		for _, tl := range q.byType {
			for key, kl := range tl.keys {
				if key != "" && kl.size == 0 { // a ring still holding it drops it at its turn
					delete(tl.keys, key)
				}
			}
		}
	}
	for name, q := range r.queues {
		if q.unfinished > 0 || q.size > 0 || q.running > 0 || q.rev != 0 || q.settings != (protocol.QueueSettings{}) {
			continue
		}
		if q.used {
			q.used = false
			continue
		}
		served := false
		for _, w := range reg.workers {
			if served = w.serves(name); served {
				break
			}
		}
		if !served {
			delete(r.queues, name)
		}
	}
}
