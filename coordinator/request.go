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

// requestJob is the id of the job a submission creates: a random one, or the one its
// request id names. ok is false when reply was given, or the submission went on off
// the caller's goroutine: a send again first looks for its job among the finished ones
// in KV (findFinished), and the API's handler serves the next request meanwhile.
func (s *scheduler) requestJob(req *protocol.SubmitJob, from request, maxAttempts int, prio protocol.Priority, reply replyFunc) (id string, ok bool) {
	if from.id == "" {
		return newID(), true
	}
	if e := protocol.CheckRequestID(from.id); e != nil {
		s.note.submitted(SubmitInvalid)
		reply(e)
		return "", false
	}
	named := protocol.RequestJobID(from.id)
	if from.first || from.looked {
		return named, true
	}
	s.run(func() {
		since, answered := s.findFinished(named, from.id, req, maxAttempts, prio, reply)
		if !answered {
			s.submit(req, request{id: from.id, looked: true, since: since, due: from.due}, reply)
		}
	})
	return "", false
}

// answerResent answers a submission sent again whose job is in memory, or was created
// and finished while findFinished read KV, and reports whether it did. Called with the
// scheduler's mu held.
func (s *scheduler) answerResent(id string, from request, req *protocol.SubmitJob, maxAttempts int, prio protocol.Priority, reply replyFunc) bool {
	if j := s.jobs[id]; j != nil { // an earlier send's job
		s.note.submitted(SubmitDuplicate)
		s.answerRequestRepeat(j, from, req, maxAttempts, prio, reply)
		return true
	}
	if from.looked && s.kept.index.createdSince(from.since, id) { // and it finished meanwhile
		s.note.submitted(SubmitDuplicate)
		s.out.reply(reply, jobSubmitted(id))
		return true
	}
	return false
}

// findFinished looks for the job of request rid sent again, id, among the finished jobs
// in KV (it may have finished, even left memory, since the send that created it),
// unless it is active: then the caller finds it in memory. answered reports that reply
// was given. since is the last sequence given before the look: a job created after it
// is in the index (createdSince).
func (s *scheduler) findFinished(id, rid string, req *protocol.SubmitJob, maxAttempts int, prio protocol.Priority, reply replyFunc) (since uint64, answered bool) {
	s.mu.Lock()
	since = s.seq
	_, active := s.jobs[id]
	s.unlock()
	if active {
		return since, false
	}
	r, err := s.readKept(id)
	switch {
	case errors.Is(err, errUnknownJob):
		return since, false
	case err != nil:
		// Whether it exists is unknown, so it cannot be created: the sender tries again.
		s.note.submitted(SubmitFailed)
		reply(&protocol.Error{Message: fmt.Sprintf("%v: cannot tell whether request %s created job %s yet (%v)", ErrNotServing, rid, id, err)})
		return since, true
	}
	s.note.submitted(SubmitDuplicate)
	if !sameSubmission(&r, req, maxAttempts, prio) {
		reply(protocol.RequestIDReused(rid, id))
	} else {
		reply(jobSubmitted(id)) // stored: whoever leads knows it
	}
	return since, true
}

// answerRequestRepeat answers a submission sent again whose job j is in memory: its id
// once it is durable, as the first send hears (answerDuplicate), and an ERROR if the
// request id came with another submission. Called with the scheduler's mu held.
func (s *scheduler) answerRequestRepeat(j *job, from request, req *protocol.SubmitJob, maxAttempts int, prio protocol.Priority, reply replyFunc) {
	if !sameSubmission(&j.rec, req, maxAttempts, prio) {
		s.out.reply(reply, protocol.RequestIDReused(from.id, j.rec.JobID))
		return
	}
	id := j.rec.JobID
	answer := jobSubmitted(id)
	if j.rev != 0 {
		s.out.reply(reply, answer)
		return
	}
	r := s.replies.by(reply, from.due, "submission", id)
	j.wait(waiter{version: 1, fn: func(err error) {
		if err != nil {
			r.send(createFailed(id, err))
			return
		}
		r.send(answer)
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
