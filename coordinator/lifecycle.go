package coordinator

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/tasktype"
)

// clip bounds a worker's result or error text to protocol.MaxTextBytes.
func clip(s *string) *string {
	if s == nil || len(*s) <= protocol.MaxTextBytes {
		return s
	}
	const mark = "... (truncated)"
	cut := protocol.MaxTextBytes - len(mark)
	for cut > 0 && !utf8.RuneStart((*s)[cut]) {
		cut--
	}
	clipped := (*s)[:cut] + mark
	return &clipped
}

// replyFunc sends the one reply to a client request, possibly later and from another goroutine.
type replyFunc func(protocol.Message)

// submit validates, deduplicates, admits and stores a new job; reply gets JOB_SUBMITTED
// only once the job is durable.
func (c *Coordinator) submit(req *protocol.SubmitJob, reply replyFunc) {
	if perr := req.CheckSubmission(); perr != nil {
		c.noteSubmit(SubmitInvalid)
		reply(perr)
		return
	}
	if err := c.validatePayload(req.TaskType, req.Payload); err != nil {
		c.noteSubmit(SubmitInvalid)
		reply(validationError(req.TaskType, err))
		return
	}
	maxAttempts := req.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = c.defaultMaxAttempts(req.TaskType)
	}
	prio := protocol.OrNormal(req.Priority)
	var key, fp string
	if req.IdempotencyKey != nil {
		key = *req.IdempotencyKey
		var err error
		if fp, err = fingerprint(req.TaskType, req.Payload, maxAttempts, prio); err != nil {
			c.noteSubmit(SubmitInvalid)
			reply(protocol.InvalidPayload(err.Error()))
			return
		}
	}

	c.mu.Lock()
	defer c.unlock()
	if c.fenced != nil {
		c.noteSubmit(SubmitFailed)
		c.replyLater(reply, c.refuse())
		return
	}
	if req.IdempotencyKey != nil {
		if j := c.keys[key]; j != nil {
			c.noteSubmit(SubmitDuplicate)
			c.answerDuplicate(j, key, fp, reply)
			return
		}
		if d, ok := c.doneKeys[key]; ok { // bound to a finished job, durable
			if d.fingerprint != fp {
				c.replyLater(reply, protocol.IdempotencyConflict(key, d.jobID))
			} else {
				c.replyLater(reply, &protocol.JobSubmitted{JobID: d.jobID})
			}
			return
		}
	}
	if c.active >= c.cfg.MaxActiveJobs {
		c.noteSubmit(SubmitRejected)
		c.replyLater(reply, protocol.AtCapacity(c.active, c.cfg.MaxActiveJobs))
		return
	}
	if e := c.storage.refusal(); e != nil { // a duplicate above needs no room
		c.noteSubmit(SubmitFailed)
		c.replyLater(reply, e)
		return
	}
	j := c.newJob(req, maxAttempts, prio, key, fp)
	defer c.assignAtOnce(j)
	c.markDirty(j, func(err error) {
		c.noteSubmit(outcomeOf(err))
		if err != nil {
			reply(notStored(j.rec.JobID, err))
			return
		}
		reply(&protocol.JobSubmitted{JobID: j.rec.JobID})
		c.mu.Lock()
		if j.rec.State == protocol.StateQueued {
			c.ready.push(j)
			c.schedule()
		}
		c.unlock()
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
func (c *Coordinator) answerDuplicate(j *job, key, fp string, reply replyFunc) {
	if j.rec.Fingerprint != fp {
		c.replyLater(reply, protocol.IdempotencyConflict(key, j.rec.JobID))
		return
	}
	answer := &protocol.JobSubmitted{JobID: j.rec.JobID}
	if j.rev != 0 {
		c.replyLater(reply, answer)
		return
	}
	j.waiters = append(j.waiters, waiter{version: 1, fn: func(err error) {
		if err != nil {
			reply(&protocol.Error{Message: fmt.Sprintf("job %s was not stored: %v", j.rec.JobID, err)})
			return
		}
		reply(answer)
	}})
}

func (c *Coordinator) newJob(req *protocol.SubmitJob, maxAttempts int, prio protocol.Priority, key, fp string) *job {
	c.seq++
	now := max(c.now().UnixMilli(), c.lastMilli)
	c.lastMilli = now
	j := &job{rec: protocol.Record{
		JobID:          newID(),
		TaskType:       req.TaskType,
		Payload:        req.Payload,
		State:          protocol.StateQueued,
		MaxAttempts:    maxAttempts,
		Priority:       prio,
		Seq:            c.seq,
		CreatedAt:      now,
		IdempotencyKey: key,
		Fingerprint:    fp,
	}}
	c.jobs[j.rec.JobID] = j
	c.index.add(j.rec.Seq, j.rec.JobID, j.rec.State, "", j)
	if key != "" {
		c.keys[key] = j
	}
	c.active++
	return j
}

// schedule assigns queued jobs while some worker has a free slot for them. Called with
// c.mu held.
func (c *Coordinator) schedule() {
	if c.fenced != nil || !c.lease.held() {
		return
	}
	for c.ready.size > 0 {
		now := c.now()
		j := c.ready.best(now, c.cfg.AgingStep, c.runnable)
		if j == nil {
			return
		}
		w := c.pickWorker(j.rec.TaskType)
		c.ready.pop(j)
		c.assign(j, w)
	}
}

// assign starts a new attempt of j on w under a fresh lease.
func (c *Coordinator) assign(j *job, w *worker) {
	now := c.now()
	j.rec.State = protocol.StateRunning
	j.rec.Attempts++
	j.rec.AttemptID = newID()
	j.rec.WorkerID = w.id
	j.rec.RetryAt = 0
	c.leaseStarted(j, now)
	w.seq++
	w.running[j.rec.JobID] = assignment{attempt: j.rec.AttemptID, seq: w.seq}
	heap.Push(&c.deadlines, j)
	c.markDirty(j, nil)
	c.log.Debug("job assigned", "job", j.rec.JobID, "attempt", j.rec.Attempts, "worker", w.id)
	m := &protocol.TaskAssign{
		JobID:         j.rec.JobID,
		AttemptID:     j.rec.AttemptID,
		AttemptNumber: j.rec.Attempts,
		TaskType:      j.rec.TaskType,
		Payload:       j.rec.Payload,
	}
	tell := func() error {
		return c.node.Tell(context.Background(), bus.Address{Role: bus.RoleWorker, ID: w.id}, protocol.PathAssign, m)
	}
	if j.rev != 0 {
		c.later(tell, w)
		return
	}
	// Not stored yet (assignAtOnce): the assignment rides on the job's first write and
	// goes once that is durable, so that a job whose creation fails never runs.
	attempt := j.rec.AttemptID
	j.waiters = append(j.waiters, waiter{version: j.version, fn: func(err error) {
		c.mu.Lock()
		defer c.unlock()
		if err == nil && j.rec.State == protocol.StateRunning && j.rec.AttemptID == attempt {
			c.later(tell, w)
		}
	}})
}

// assignAtOnce assigns a job just submitted, and not yet stored, when nothing waits
// before it and a worker has a free slot for it: then one write stores it already
// RUNNING, where queueing it first cost a write of its own (3 writes a job became 2
// in the peers' benchmark). Its submitter and its worker both hear once that write is
// durable. Called with c.mu held.
func (c *Coordinator) assignAtOnce(j *job) {
	if c.ready.size > 0 || j.rec.State != protocol.StateQueued || c.jobs[j.rec.JobID] != j {
		return
	}
	c.ready.push(j)
	c.schedule()
	if j.rec.State == protocol.StateQueued {
		c.ready.forget(j) // it is made ready once stored, as any job is
	}
}

// result applies a worker's TASK_RESULT. reply gets the acknowledgement once the outcome
// is durable; a stale result changes nothing and is acknowledged at once.
func (c *Coordinator) result(res *protocol.TaskResult, reply func(protocol.ResultAck, error)) {
	c.mu.Lock()
	defer c.unlock()
	if w := c.workers[res.WorkerID]; w != nil && w.running[res.JobID].attempt == res.AttemptID {
		delete(w.running, res.JobID)
	}
	j := c.jobs[res.JobID]
	if err := assignedTo(j, res); err != nil {
		c.later(func() error { reply(protocol.ResultAck{JobID: res.JobID, Accepted: false}, err); return nil }, nil)
		return
	}
	if j == nil || j.rec.State != protocol.StateRunning || j.rec.AttemptID != res.AttemptID || c.fenced != nil {
		c.log.Debug("stale result ignored", "job", res.JobID, "attempt", res.AttemptID, "worker", res.WorkerID)
		c.later(func() error { reply(protocol.ResultAck{JobID: res.JobID, Accepted: false}, nil); return nil }, nil)
		c.schedule()
		return
	}
	c.releaseLease(j)
	if res.Success {
		j.rec.State = protocol.StateCompleted
		j.rec.Result = clip(res.Result)
		c.active--
	} else {
		cause := "task failed"
		if res.Error != nil && *res.Error != "" {
			cause = *clip(res.Error)
		}
		if res.Permanent {
			c.failPermanently(j, cause)
		} else {
			c.retryOrFail(j, cause)
		}
	}
	c.markDirty(j, func(err error) { reply(protocol.ResultAck{JobID: res.JobID, Accepted: err == nil}, err) })
	c.log.Debug("job result", "job", j.rec.JobID, "state", j.rec.State, "attempt", j.rec.Attempts)
	c.schedule()
}

// releaseLease ends j's current attempt: its worker's slot is freed and the lease id
// forgotten, so any later result for it is stale.
func (c *Coordinator) releaseLease(j *job) {
	if w := c.workers[j.rec.WorkerID]; w != nil && w.running[j.rec.JobID].attempt == j.rec.AttemptID {
		delete(w.running, j.rec.JobID)
	}
	c.deadlines.remove(j)
	c.leaseEnded(j)
	j.rec.LastWorkerID = j.rec.WorkerID // a finished job says who ran it
	j.rec.WorkerID = ""
	j.rec.AttemptID = ""
}

// revoke ends a RUNNING attempt early and tells its worker to stop it (best effort).
func (c *Coordinator) revoke(j *job) {
	w, attempt := j.rec.WorkerID, j.rec.AttemptID
	c.releaseLease(j)
	if c.workers[w] != nil {
		m := &protocol.TaskCancel{JobID: j.rec.JobID, AttemptID: attempt}
		c.later(func() error {
			_ = c.node.Tell(context.Background(), bus.Address{Role: bus.RoleWorker, ID: w}, protocol.PathCancel, m)
			return nil
		}, nil)
	}
}

// retryOrFail moves a job whose attempt ended badly to RETRY_WAIT, or to FAILED when no
// attempts are left. The lease must already be released.
func (c *Coordinator) retryOrFail(j *job, cause string) {
	if j.rec.Attempts < j.rec.MaxAttempts {
		j.rec.State = protocol.StateRetryWait
		j.rec.Error = ptr(cause)
		j.rec.RetryAt = c.now().Add(c.cfg.retryDelay(j.rec.Attempts)).UnixMilli()
		c.pushRetry(j)
		return
	}
	j.rec.State = protocol.StateFailed
	j.rec.Error = ptr(fmt.Sprintf("%s (all %d attempts used)", cause, j.rec.MaxAttempts))
	c.active--
}

// cancel moves an active job to CANCELLED; reply gets JOB_CANCEL once that is durable.
func (c *Coordinator) cancelJob(id string, reply replyFunc) {
	c.mu.Lock()
	j := c.jobs[id]
	if j == nil { // finished (its record is in KV), or unknown
		c.unlock()
		c.cancelFinished(id, reply)
		return
	}
	defer c.unlock()
	if j.rec.State.Terminal() {
		c.replyLater(reply, &protocol.JobCancel{Cancelled: false, Job: j.snapshot()})
		return
	}
	if c.fenced != nil {
		c.replyLater(reply, c.refuse())
		return
	}
	switch j.rec.State {
	case protocol.StateQueued:
		c.ready.forget(j)
	case protocol.StateRunning:
		c.revoke(j)
	}
	j.rec.State = protocol.StateCancelled
	j.rec.Error = ptr("cancelled by client request")
	j.rec.RetryAt = 0
	c.active--
	c.markDirty(j, func(err error) {
		if err != nil {
			reply(&protocol.Error{Message: fmt.Sprintf("cancel of job %s was not stored: %v", id, err)})
			return
		}
		c.mu.Lock()
		snap := j.snapshot()
		c.unlock()
		reply(&protocol.JobCancel{Cancelled: true, Job: snap})
	})
	c.log.Debug("job cancelled", "job", id)
	c.schedule()
}

// cancelFinished answers the cancel of a job that is not active: cancelled:false with
// its snapshot, read from KV, or Unknown job.
func (c *Coordinator) cancelFinished(id string, reply replyFunc) {
	snap, err := c.snapshot(id)
	switch {
	case errors.Is(err, errUnknownJob):
		reply(protocol.UnknownJob(id))
	case err != nil:
		reply(err.(*protocol.Error))
	default:
		reply(&protocol.JobCancel{Cancelled: false, Job: snap})
	}
}

// sweep releases due retries, enforces deadlines, loses silent workers, then schedules.
func (c *Coordinator) sweep() {
	c.mu.Lock()
	defer c.unlock()
	if c.fenced != nil || !c.lease.held() {
		return // another may lead; or NATS is cut off, and silence is not the workers'
	}
	now := c.now()
	c.expire(now)
	for _, t := range c.retries.due(now) {
		j := t.j
		if j.rec.State != protocol.StateRetryWait || itoa(j.rec.Attempts) != t.key {
			continue
		}
		j.rec.State = protocol.StateQueued
		j.rec.RetryAt = 0
		c.markDirty(j, nil)
		c.ready.push(j)
	}
	for _, j := range c.deadlines.due(now) {
		if j.rec.State != protocol.StateRunning {
			continue
		}
		w := j.rec.WorkerID
		c.noteDeadline(j)
		c.revoke(j)
		c.retryOrFail(j, fmt.Sprintf("execution deadline exceeded (%d ms) on worker %s", j.timeout.Milliseconds(), w))
		c.markDirty(j, nil)
	}
	if !c.cutOff(now) {
		for _, w := range c.workers {
			if now.Sub(w.lastSeen) > c.cfg.HeartbeatTimeout && now.After(w.graceUntil) {
				c.loseWorker(w, "heartbeat timeout")
			}
		}
		c.expireClaims(now)
	}
	c.schedule()
}

// pushRetry arms the timer that returns a RETRY_WAIT job to the queue.
func (c *Coordinator) pushRetry(j *job) {
	heap.Push(&c.retries, timer{at: time.UnixMilli(j.rec.RetryAt), j: j, key: itoa(j.rec.Attempts)})
}
