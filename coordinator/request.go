package coordinator

import (
	"errors"
	"fmt"

	"github.com/jobbus/jobbus/bus/protocol"
)

// A submission sent with a request id (protocol.HeaderRequestID) creates the job whose
// id RequestJobID derives from it, so whether a former send created it is a lookup of
// that id: among the jobs in memory, and, for a send after the first, among the finished
// ones in KV. Both are rebuilt from the JOBS stream by every new leader, and the term
// fences a deposed leader's creates (batch.go), so a send that reaches the next leader
// after a failover finds what the last one stored, and only that. JetStream's own
// deduplication (Nats-Msg-Id) cannot carry this: an atomic batch holding a duplicate
// fails whole (JSAtomicPublishContainsDuplicateMessageErr), so one resent submission
// would fail the group commit of every job beside it, and a duplicate's acknowledgement
// names only a sequence that a later write of the record may have replaced. The window
// is the job's own retention.

// findFinished looks for the job of request rid sent again, id, among the finished jobs
// in KV (it may have finished, even expired from memory, since the send that created
// it), unless it is active: then the caller finds it in memory. answered reports that
// reply was given. since is the last sequence given before the look: a job created after
// it is in the index (createdSince).
func (c *Coordinator) findFinished(id, rid string, req *protocol.SubmitJob, maxAttempts int, prio protocol.Priority, reply replyFunc) (since uint64, answered bool) {
	c.mu.Lock()
	since = c.seq
	_, active := c.jobs[id]
	c.unlock()
	if active {
		return since, false
	}
	r, err := c.readKept(id)
	switch {
	case errors.Is(err, errUnknownJob):
		return since, false
	case err != nil:
		// Whether it exists is unknown, so it cannot be created: the sender tries again.
		c.noteSubmit(SubmitFailed)
		reply(&protocol.Error{Message: fmt.Sprintf("%v: cannot tell whether request %s created job %s yet (%v)", ErrNotServing, rid, id, err)})
		return since, true
	}
	c.noteSubmit(SubmitDuplicate)
	if !sameSubmission(&r, req, maxAttempts, prio) {
		reply(protocol.RequestIDReused(rid, id))
	} else {
		reply(&protocol.JobSubmitted{JobID: id})
	}
	return since, true
}

// answerRequestRepeat answers a submission sent again whose job j is in memory: its id
// once it is durable, an ERROR if the request id came with another submission. Called
// with c.mu held.
func (c *Coordinator) answerRequestRepeat(j *job, rid string, req *protocol.SubmitJob, maxAttempts int, prio protocol.Priority, reply replyFunc) {
	if !sameSubmission(&j.rec, req, maxAttempts, prio) {
		c.replyLater(reply, protocol.RequestIDReused(rid, j.rec.JobID))
		return
	}
	answer := &protocol.JobSubmitted{JobID: j.rec.JobID}
	if j.rev != 0 {
		c.replyLater(reply, answer)
		return
	}
	j.waiters = append(j.waiters, waiter{version: 1, fn: func(err error) {
		if err != nil {
			reply(notStored(j.rec.JobID, err))
			return
		}
		reply(answer)
	}})
}

// sameSubmission reports whether req (with its effective max attempts and priority) is
// the submission that created r, as an idempotency key's fingerprint compares them.
func sameSubmission(r *protocol.Record, req *protocol.SubmitJob, maxAttempts int, prio protocol.Priority) bool {
	key := ""
	if req.IdempotencyKey != nil {
		key = *req.IdempotencyKey
	}
	if r.TaskType != req.TaskType || r.MaxAttempts != maxAttempts || r.Priority != prio || r.IdempotencyKey != key {
		return false
	}
	a, errA := canonicalJSON(r.Payload)
	b, errB := canonicalJSON(req.Payload)
	return errA == nil && errB == nil && string(a) == string(b)
}

// createdSince reports whether a live job of id was added after sequence since: the
// few submissions that came in while a lookup read KV.
func (x *jobIndex) createdSince(since uint64, id string) bool {
	for i := x.below(since + 1); i < len(x.entries); i++ {
		if e := &x.entries[i]; e.live() && x.hasID(e, id) {
			return true
		}
	}
	return false
}
