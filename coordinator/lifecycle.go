package coordinator

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/tasktype"
)

// clip bounds a worker's result or error text to protocol.MaxTextBytes.
func clip(s *string) *string {
	if s == nil || len(*s) <= protocol.MaxTextBytes {
		return s
	}
	clipped := protocol.ClipText(*s)
	return &clipped
}

// replyFunc sends the one reply to a client request, possibly later and from another goroutine.
type replyFunc func(protocol.Message)

// submit validates, deduplicates, admits and stores a new job; reply gets JOB_SUBMITTED
// only once the job is durable, an ERROR only when it certainly is not, and "Outcome
// unknown" when neither is known within from.due (outcome.go). A submission with a
// request id creates the job RequestJobID names, once: sent again, it is answered with
// that job (request.go).
func (s *scheduler) submit(req *protocol.SubmitJob, from request, reply replyFunc) {
	due := from.due
	var arrived time.Time
	if s.tracer.On() {
		arrived = s.now()
	}
	if perr := req.CheckSubmission(); perr != nil {
		s.note.submitted(SubmitInvalid)
		reply(perr)
		return
	}
	runAt, perr := runTimeOf(req, s.now()) // delayed.go; 0: now
	if perr != nil {
		s.note.submitted(SubmitInvalid)
		reply(perr)
		return
	}
	if err := s.route.validatePayload(req.TaskType, req.Payload); err != nil {
		s.note.submitted(SubmitInvalid)
		reply(validationError(req.TaskType, err))
		return
	}
	if perr := s.route.queueFields(req); perr != nil { // dispatch.go
		s.note.submitted(SubmitInvalid)
		reply(perr)
		return
	}
	maxAttempts := req.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = s.route.defaultMaxAttempts(req.TaskType)
	}
	prio := protocol.OrNormal(req.Priority)
	var key, fp string
	if req.IdempotencyKey != nil {
		key = *req.IdempotencyKey
		var err error
		if fp, err = fingerprint(req.TaskType, req.Payload, maxAttempts, prio); err != nil {
			s.note.submitted(SubmitInvalid)
			reply(protocol.InvalidPayload(err.Error()))
			return
		}
	}
	parents, perr := s.finishedParents(req.After) // deps.go
	if perr != nil {
		s.note.submitted(SubmitInvalid)
		reply(perr)
		return
	}
	wish, uerr := uniqueOf(req) // unique.go
	if uerr != nil {
		s.note.submitted(SubmitInvalid)
		reply(uerr)
		return
	}
	id, ok := s.requestJob(req, from, maxAttempts, prio, reply) // request.go
	if !ok {
		return
	}

	s.mu.Lock()
	defer s.unlock()
	if s.fenced != nil {
		s.note.submitted(SubmitFailed)
		s.out.reply(reply, s.refuse())
		return
	}
	if from.id != "" && s.answerResent(id, from, req, maxAttempts, prio, reply) {
		return
	}
	if req.IdempotencyKey != nil {
		if j := s.keys[key]; j != nil {
			s.note.submitted(SubmitDuplicate)
			s.answerDuplicate(j, key, fp, due, reply)
			return
		}
		if d, ok := s.kept.doneKeys[key]; ok { // bound to a finished job, durable
			if d.fingerprint != fp {
				s.out.reply(reply, protocol.IdempotencyConflict(key, d.jobID))
			} else {
				s.out.reply(reply, jobSubmitted(d.jobID))
			}
			return
		}
	}
	if wish.key != "" && s.answerUnique(wish.key, due, reply) {
		return
	}
	if rej := s.admits(runAt != 0); rej != nil { // delayed.go
		s.note.submitted(SubmitRejected)
		s.out.reply(reply, rej)
		return
	}
	if e := s.store.health().refusal(); e != nil { // a duplicate above needs no room
		s.note.submitted(SubmitFailed)
		s.out.reply(reply, e)
		return
	}
	var waitOn []*job
	if len(req.After) > 0 {
		if waitOn, perr = s.activeParents(req.After, req.AfterAnyEnd, parents); perr != nil { // deps.go
			s.note.submitted(SubmitInvalid)
			s.out.reply(reply, perr)
			return
		}
	}
	j := s.newJob(id, req, maxAttempts, prio, key, fp)
	j.rec.Schedule = from.schedule // the schedule whose tick this is (schedules.go), or none
	s.uniq.hold(j, wish)
	switch {
	case len(req.After) > 0:
		j.rec.After, j.rec.AfterAnyEnd = req.After, req.AfterAnyEnd
		s.waitFor(j, waitOn)
	case runAt != 0:
		s.delay(j, runAt) // delayed.go
	}
	stored := s.traceSubmission(j, from, arrived) // trace.go
	defer s.assignAtOnce(j)
	r := s.replies.by(reply, due, "submission", id)
	j.answer = r
	s.markDirty(j, func(err error) {
		if stored != nil {
			stored(err)
		}
		if err != nil {
			s.mu.Lock()
			j.answer = nil
			s.mu.Unlock()
			if r.send(createFailed(id, err)) {
				s.note.submitted(outcomeOf(err))
			}
			return
		}
		// The job is ready before its submitter hears: a client told JOB_SUBMITTED
		// finds it queued behind nothing submitted after it.
		s.mu.Lock()
		j.answer = nil
		switch j.rec.State {
		case protocol.StateQueued:
			s.ready.push(j)
			s.schedule()
		case protocol.StateScheduled:
			s.stored(j) // delayed.go
		}
		s.unlock()
		if r.send(jobSubmitted(id)) {
			s.note.submitted(SubmitAccepted)
		}
	})
}

func validationError(taskType string, err error) *protocol.Error {
	var pe *tasktype.PayloadError
	if errors.As(err, &pe) {
		return protocol.InvalidPayload(pe.Message)
	}
	if errors.Is(err, tasktype.ErrUnknown) {
		return protocol.UnknownTaskType(taskType)
	}
	return protocol.InvalidPayload(err.Error())
}

// answerDuplicate replies to a submission whose idempotency key is already bound: the
// original job id (once that job is durable) for the same request, an ERROR otherwise.
// While the original's outcome is not known, the duplicate's is not either.
func (s *scheduler) answerDuplicate(j *job, key, fp string, due time.Duration, reply replyFunc) {
	if j.rec.Fingerprint != fp {
		s.out.reply(reply, protocol.IdempotencyConflict(key, j.rec.JobID))
		return
	}
	s.answerWhenCreated(j.rec.JobID, j, due, reply)
}

// answerWhenCreated answers JOB_SUBMITTED with id once j, the job it names, is durable
// (at once if it is, or if j is not in memory any more), or what its creation's failure
// means. Called with the scheduler's mu held.
func (s *scheduler) answerWhenCreated(id string, j *job, due time.Duration, reply replyFunc) {
	answer := jobSubmitted(id)
	if j == nil || j.rev != 0 {
		s.out.reply(reply, answer)
		return
	}
	r := s.replies.by(reply, due, "submission", id)
	j.wait(waiter{version: 1, fn: func(err error) {
		if err != nil {
			r.send(createFailed(id, err))
			return
		}
		r.send(answer)
	}})
}

// createFailed is the answer to the submission of job id, whose create failed with err.
func createFailed(id string, err error) protocol.Message {
	return writeFailed("submission", id, err, func() *protocol.Error { return notStored(id, err) })
}

func (s *scheduler) newJob(id string, req *protocol.SubmitJob, maxAttempts int, prio protocol.Priority, key, fp string) *job {
	s.seq++
	now := max(s.now().UnixMilli(), s.lastMilli)
	s.lastMilli = now
	j := &job{rec: protocol.Record{
		JobID:          id,
		TaskType:       req.TaskType,
		Payload:        req.Payload,
		State:          protocol.StateQueued,
		MaxAttempts:    maxAttempts,
		Priority:       prio,
		Seq:            s.seq,
		CreatedAt:      now,
		IdempotencyKey: key,
		Fingerprint:    fp,
		Queue:          req.Queue,
		ConcurrencyKey: req.ConcurrencyKey,
	}}
	s.jobs[j.rec.JobID] = j
	s.kept.index.add(j.rec.Seq, j.rec.JobID, j.rec.State, "", j)
	if key != "" {
		s.keys[key] = j
	}
	s.active++
	s.ready.queue(req.Queue).used = true // a queue exists from its first job (queue.go)
	return j
}

// schedule assigns queued jobs while some worker has a free slot for them
// (dispatch.go). Called with the scheduler's mu held.
func (s *scheduler) schedule() {
	if s.fenced != nil || !s.lease.held() || s.ready.size == 0 {
		return
	}
	now := s.now()
	s.ready.round++
	round := s.ready.round
	for s.ready.size > 0 {
		w := s.reg.freest(round)
		if w == nil {
			return
		}
		j := s.jobFor(w, now)
		if j == nil {
			w.idleRound = round
			continue
		}
		s.ready.pop(j)
		s.assign(j, w)
	}
}

// admitted asks flow whether a job of queue and taskType may start at now; when not,
// dispatch looks again once flow says one may.
func (s *scheduler) admitted(queue, taskType string, now time.Time) bool {
	ok, next := s.flow.admits(queue, taskType, now)
	if !ok && (s.flowWake.IsZero() || next.Before(s.flowWake)) {
		s.flowWake = next // one wake-up, however many jobs are held back
		s.timers.call(next, func(time.Time) { s.flowWake = time.Time{} })
	}
	return ok
}

// assign starts a new attempt of j on w under a fresh lease.
func (s *scheduler) assign(j *job, w *worker) {
	now := s.now()
	queuedSince := j.queuedSince()
	s.flow.started(queueOf(j), j.rec.TaskType, now)
	s.ready.queue(queueOf(j)).startedAt(now)
	j.rec.State = protocol.StateRunning
	j.rec.Attempts++
	j.rec.AttemptID = newID()
	j.rec.WorkerID = w.id
	j.rec.RetryAt = 0
	s.route.leaseStarted(j, now)
	a := assignment{attempt: j.rec.AttemptID, seq: unsent}
	if j.rev != 0 {
		w.seq++
		a.seq = w.seq
	}
	w.running[j.rec.JobID] = a
	heap.Push(&s.deadlines, j)
	j.clearProgress() // the new attempt's own, once it reports
	s.markDirty(j, nil)
	if s.debugging() { // hotlog.go
		s.log.Debug("job assigned", "job", j.rec.JobID, "attempt", j.rec.Attempts, "worker", w.id)
	}
	defer s.traceQueued(j, queuedSince) // after the assignment, in the outbox
	m := &protocol.TaskAssign{
		JobID:         j.rec.JobID,
		AttemptID:     j.rec.AttemptID,
		AttemptNumber: j.rec.Attempts,
		TaskType:      j.rec.TaskType,
		Payload:       j.rec.Payload,
	}
	m.TraceParent, m.TraceState = j.traceContext()
	if j.rev != 0 {
		s.out.assign(w, m)
		return
	}
	// Not stored yet (assignAtOnce): the assignment rides on the job's first write and
	// goes once that is durable, so that a job whose creation fails never runs. It is
	// numbered only then: a mark must not count it before it is sent (reconcile.go),
	// or a create slow to confirm is taken for an assignment lost on the way.
	// The waiter runs with mu held (writtenAll), so that the assignments a burst of
	// writes releases leave together.
	attempt := j.rec.AttemptID
	j.wait(waiter{version: j.version, locked: true, fn: func(err error) {
		if err == nil && j.rec.State == protocol.StateRunning && j.rec.AttemptID == attempt {
			if a := w.running[j.rec.JobID]; a.attempt == attempt {
				w.seq++
				a.seq = w.seq
				w.running[j.rec.JobID] = a
			}
			s.out.assign(w, m)
		}
	}})
}

// assignAtOnce assigns a job just submitted, and not yet stored, when nothing waits
// before it and a worker has a free slot for it: then one write stores it already
// RUNNING, where queueing it first cost a write of its own (3 writes a job became 2
// in the peers' benchmark). Its submitter and its worker both hear once that write is
// durable. Called with the scheduler's mu held.
func (s *scheduler) assignAtOnce(j *job) {
	if s.ready.waiting(queueOf(j)) || j.rec.State != protocol.StateQueued || s.jobs[j.rec.JobID] != j {
		return
	}
	s.ready.push(j)
	s.schedule()
	if j.rec.State == protocol.StateQueued {
		s.ready.forget(j) // it is made ready once stored, as any job is
	}
}

// result applies a worker's TASK_RESULT. reply gets the acknowledgement once the outcome
// is durable; a stale result changes nothing and is acknowledged at once, once what
// made it stale is stored (unsure).
func (s *scheduler) result(res *protocol.TaskResult, reply func(protocol.ResultAck, error)) {
	s.mu.Lock()
	defer s.unlock()
	s.applyResult(res, reply)
	s.schedule()
}

// results applies a batch of a worker's results (PathResults) under one hold of the
// lock: each as result would, reply(i, ...) answering results[i]; the slots they free
// are scheduled once, and the writes they make share the writer's commits.
func (s *scheduler) results(results []*protocol.TaskResult, reply func(i int, ack protocol.ResultAck, err error)) {
	s.mu.Lock()
	defer s.unlock()
	for i, res := range results {
		s.applyResult(res, func(ack protocol.ResultAck, err error) { reply(i, ack, err) })
	}
	s.schedule()
}

// applyResult is result's work, without the scheduling that follows it. Called with
// the scheduler's mu held.
func (s *scheduler) applyResult(res *protocol.TaskResult, reply func(protocol.ResultAck, error)) {
	if w := s.reg.workers[res.WorkerID]; w != nil && w.running[res.JobID].attempt == res.AttemptID {
		delete(w.running, res.JobID)
	}
	j := s.jobs[res.JobID]
	if err := assignedTo(j, res); err != nil {
		s.out.later(func() error { reply(protocol.ResultAck{JobID: res.JobID, Accepted: false}, err); return nil }, nil)
		return
	}
	if j == nil || j.rec.State != protocol.StateRunning || j.rec.AttemptID != res.AttemptID || s.fenced != nil {
		if err := s.unsure(j); err != nil {
			s.out.later(func() error { reply(protocol.ResultAck{JobID: res.JobID, Accepted: false}, err); return nil }, nil)
			return
		}
		s.log.Debug("stale result ignored", "job", res.JobID, "attempt", res.AttemptID, "worker", res.WorkerID)
		s.out.later(func() error { reply(protocol.ResultAck{JobID: res.JobID, Accepted: false}, nil); return nil }, nil)
		return
	}
	settled := s.traceResult(j) // trace.go
	s.releaseLease(j)
	if res.Success {
		j.rec.State = protocol.StateCompleted
		j.rec.Result = clip(res.Result)
		s.active--
	} else {
		cause := "task failed"
		if res.Error != nil && *res.Error != "" {
			cause = *clip(res.Error)
		}
		switch {
		case res.SnoozeMillis > 0:
			s.snooze(j, res.SnoozeMillis) // delayed.go
		case res.Permanent:
			s.failPermanently(j, cause)
		default:
			s.retryOrFail(j, cause)
		}
	}
	if settled != nil {
		state := j.rec.State
		s.markDirty(j, func(err error) {
			settled(state, err)
			reply(protocol.ResultAck{JobID: res.JobID, Accepted: err == nil}, err)
		})
	} else {
		s.markDirty(j, func(err error) { reply(protocol.ResultAck{JobID: res.JobID, Accepted: err == nil}, err) })
	}
	if s.debugging() {
		s.log.Debug("job result", "job", j.rec.JobID, "state", j.rec.State, "attempt", j.rec.Attempts)
	}
}

// errChangeNotStored refuses a result whose job has changed in memory only.
var errChangeNotStored = errors.New("its job's last change is not stored yet: offer the result again")

// unsure says why a result that memory finds stale (its attempt ended, or unknown) may
// count after all, or nil when the store says it is stale too. The store is what the
// next leader goes on from: while a change of the job is not stored (its write in
// flight, or failed), or once this coordinator is fenced (a newer one leads, from the
// store), the attempt may be RUNNING there. That is the case of a result applied whose
// write is slow (a stream without a quorum, a full store): its worker's ask times out
// and it offers the result again. A worker drops a result answered "not accepted", so
// it hears 503 instead, and offers it again until it is answered here, once the job is
// stored, or by the next leader. (Any change not stored, not only the one that ended
// the attempt: that one is often written with the next, the assignment of a new
// attempt, which goes before it is stored.) Called with the scheduler's mu held.
func (s *scheduler) unsure(j *job) error {
	switch {
	case s.fenced != nil: // until its handlers are withdrawn
		return fmt.Errorf("%w: %w", ErrNotServing, s.fenced)
	case j != nil && j.stored != j.version:
		return errChangeNotStored
	}
	return nil
}

// releaseLease ends j's current attempt: its worker's slot is freed and the lease id
// forgotten, so any later result for it is stale.
func (s *scheduler) releaseLease(j *job) {
	if w := s.reg.workers[j.rec.WorkerID]; w != nil && w.running[j.rec.JobID].attempt == j.rec.AttemptID {
		delete(w.running, j.rec.JobID)
	}
	s.deadlines.remove(j)
	s.route.leaseEnded(j)
	j.rec.LastWorkerID = j.rec.WorkerID // a finished job says who ran it
	j.rec.WorkerID = ""
	j.rec.AttemptID = ""
}

// revoke ends a RUNNING attempt early and tells its worker to stop it (best effort).
func (s *scheduler) revoke(j *job) {
	w, attempt := j.rec.WorkerID, j.rec.AttemptID
	s.releaseLease(j)
	if s.reg.workers[w] != nil {
		m := &protocol.TaskCancel{JobID: j.rec.JobID, AttemptID: attempt}
		s.out.later(func() error {
			_ = s.link.Tell(context.Background(), bus.Address{Role: bus.RoleWorker, ID: w}, protocol.PathCancel, m)
			return nil
		}, nil)
	}
}

// retryOrFail moves a job whose attempt ended badly to RETRY_WAIT, or to FAILED when no
// attempts are left. The lease must already be released.
func (s *scheduler) retryOrFail(j *job, cause string) {
	if j.rec.Attempts < j.rec.MaxAttempts {
		j.rec.State = protocol.StateRetryWait
		j.rec.Error = ptr(cause)
		j.rec.RetryAt = s.now().Add(s.cfg.retryDelay(j.rec.Attempts)).UnixMilli()
		j.vis.queuedFrom = j.rec.RetryAt // queued again then (trace.go)
		s.pushRetry(j)
		return
	}
	j.rec.State = protocol.StateFailed
	j.rec.Error = ptr(fmt.Sprintf("%s (all %d attempts used)", cause, j.rec.MaxAttempts))
	s.active--
}

// cancelActive moves active job j to CANCELLED with cause: out of the ready queue, or
// its attempt revoked. The caller writes it. Called with the scheduler's mu held.
func (s *scheduler) cancelActive(j *job, cause string) {
	switch j.rec.State {
	case protocol.StateQueued:
		s.ready.forget(j)
	case protocol.StateRunning:
		s.revoke(j)
	}
	j.rec.State = protocol.StateCancelled
	j.rec.Error = ptr(cause)
	j.rec.RetryAt = 0
	s.active--
}

// cancelJob moves an active job to CANCELLED; reply gets JOB_CANCEL once that is
// durable, an ERROR when it certainly is not, "Outcome unknown" when neither is known
// within due.
func (s *scheduler) cancelJob(id string, due time.Duration, reply replyFunc) {
	s.mu.Lock()
	j := s.jobs[id]
	if j == nil { // finished (its record is in KV), SCHEDULED far ahead, or unknown
		s.unlock()
		if !s.cancelCold(id, due, reply) { // delayed.go
			s.cancelFinished(id, reply)
		}
		return
	}
	defer s.unlock()
	if j.rec.State.Terminal() {
		s.out.reply(reply, &protocol.JobCancel{Cancelled: false, Job: j.snapshot()})
		return
	}
	if s.fenced != nil {
		s.out.reply(reply, s.refuse())
		return
	}
	s.cancelActive(j, "cancelled by client request")
	r := s.replies.by(reply, due, "cancel", id)
	s.markDirty(j, func(err error) {
		if err != nil {
			r.send(writeFailed("cancel", id, err, func() *protocol.Error {
				return &protocol.Error{Message: fmt.Sprintf("cancel of job %s was not stored: %v", id, err)}
			}))
			return
		}
		s.mu.Lock()
		snap := j.snapshot()
		s.unlock()
		r.send(settled{&protocol.JobCancel{Cancelled: true, Job: snap}})
	})
	s.log.Debug("job cancelled", "job", id)
	s.schedule()
}

// cancelFinished answers the cancel of a job that is not active: cancelled:false with
// its snapshot, read from KV, or Unknown job.
func (s *scheduler) cancelFinished(id string, reply replyFunc) {
	snap, err := s.snapshot(id)
	switch {
	case errors.Is(err, errUnknownJob):
		reply(protocol.UnknownJob(id))
	case err != nil:
		reply(err.(*protocol.Error))
	default:
		reply(&protocol.JobCancel{Cancelled: false, Job: snap})
	}
}

// sweep enforces deadlines, loses silent workers, then schedules.
func (s *scheduler) sweep() {
	s.mu.Lock()
	defer s.unlock()
	if s.fenced != nil || !s.lease.held() {
		return // another may lead; or NATS is cut off, and silence is not the workers'
	}
	now := s.now()
	s.kept.expire(now)
	s.collectGroups(now)
	s.ready.collect(now, s.reg)
	s.timers.fire(now) // the driver's backstop, and an injected clock's
	for _, j := range s.deadlines.due(now) {
		if j.rec.State != protocol.StateRunning {
			continue
		}
		w := j.rec.WorkerID
		s.note.deadline(j)
		s.revoke(j)
		s.retryOrFail(j, fmt.Sprintf("execution deadline exceeded (%d ms) on worker %s", j.timeout.Milliseconds(), w))
		s.markDirty(j, nil)
	}
	if !s.reg.cutOff(now) {
		for _, w := range s.reg.workers {
			if now.Sub(w.lastSeen) > s.cfg.HeartbeatTimeout && now.After(w.graceUntil) {
				s.reg.loseWorker(w, "heartbeat timeout")
			}
		}
		s.claims.expire(now)
	}
	s.schedule()
}

// pushRetry arms the timer that returns a RETRY_WAIT job to the queue.
func (s *scheduler) pushRetry(j *job) { s.timers.wakeJob(j, time.UnixMilli(j.rec.RetryAt)) }
