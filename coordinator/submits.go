package coordinator

import (
	"encoding/json"
	"sync/atomic"

	"github.com/jobbus/jobbus/bus/protocol"
)

// serveSubmits serves a SUBMIT_JOBS, several submissions in one request (PROTOCOL.md
// "Submissions in batches"): each submission in it exactly as if it had come alone on
// jobbus.api.submit, with the batch's headers (due time, send count, trace context)
// and its own request id; reply gets one JOBS_SUBMITTED once every one is answered,
// each answer the bytes the submission alone would have got. A batch that is empty,
// larger than protocol.MaxSubmissions, or sent to a fenced coordinator is refused
// whole, with one ERROR, before any of it is acted on (a lapsed lease refuses it
// whole already, in endpoint).
//
// The batch's trace context, if any, is each submission's, as a workflow's is each
// step's (stepTrace): the items carry none of their own.
func (a *api) serveSubmits(m *protocol.SubmitJobs, from request, reply replyFunc) {
	switch n := len(m.Jobs); {
	case n == 0:
		reply(protocol.NoSubmissions())
		return
	case n > protocol.MaxSubmissions:
		reply(protocol.TooManySubmissions(n))
		return
	}
	if e := a.sched.refusing(); e != nil {
		reply(e)
		return
	}
	b := &submitBatch{a: a, reply: reply, answers: make([]json.RawMessage, len(m.Jobs))}
	b.left.Store(int32(len(m.Jobs)))
	for i := range m.Jobs {
		item := from
		item.id = m.Jobs[i].RequestID // its job is RequestJobID(id), sent again or not (request.go)
		a.serveRequest(m.Jobs[i].Submit, item, protocol.TypeSubmitJob, func(ans protocol.Message) { b.answer(i, ans) })
	}
}

// submitBatch gathers the answers of a SUBMIT_JOBS' submissions, which come each once
// (replyFunc), in any order and from any goroutine: some while serveSubmits runs, most
// from the writer once their job is durable. Whoever gives the last one replies.
type submitBatch struct {
	a       *api
	reply   replyFunc
	answers []json.RawMessage // answers[i] is written by the i-th submission's answer only
	left    atomic.Int32      // answers still to come; its last decrement sees every answer
}

// answer takes the i-th submission's answer m, as the endpoint would send it alone:
// the same message (answerNow) in the same bytes (encodeReply).
func (b *submitBatch) answer(i int, m protocol.Message) {
	b.answers[i], _ = encodeReply(b.a.answerNow(m))
	if b.left.Add(-1) == 0 {
		// Each answer is already what goes now: the batch's lease check is theirs.
		b.reply(settled{&protocol.JobsSubmitted{Answers: b.answers}})
	}
}
