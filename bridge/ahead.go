package bridge

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
)

// A client may send requests ahead of their replies (PROTOCOL.md: "a connection may
// carry many requests"). Submissions sent so are forwarded at once, up to aheadMax per
// connection, while their replies are written in order, those ready together in one
// write: a client that shares one connection among many callers then costs a write
// and a read per several requests rather than per request. Anything else, and a
// submission larger than aheadFrame, waits for the replies ahead of it and is served
// in line, so what a connection holds at once stays small (aheadMax small frames and
// their small replies) and a listing's large reply is never held behind another.
//
// A batch takes at most batchMax submissions. Callers that share a connection get
// their replies together and send again together, so with large batches all of them
// would travel in one batch at a time (a convoy), waiting for its slowest write; with
// 16 callers, batches of 4 ran at 1.05-1.10x the rate of batches of 16, for 1.00-1.05x
// the CPU (three sets of 6-10 alternating rounds of bench --transport tcp).
const (
	aheadMax   = 32
	aheadFrame = 16 << 10
	batchMax   = 4
)

// pipe is what a client connection has in flight ahead of the request being read:
// the replies to write, in order, and the writer goroutine that writes them. The
// connection's reader and the writer never write at the same time: the reader writes
// only while nothing is in flight, and the writer only what is.
type pipe struct {
	b   *Bridge
	c   net.Conn
	log *slog.Logger

	// wbuf and wdl are the connection's reply buffer and write deadline, used by the
	// reader while nothing is in flight and by the writer otherwise.
	wbuf []byte
	wdl  deadline

	queue    chan *ahead   // nil until the first request sent ahead
	gather   *batch        // the submissions read ahead and not yet forwarded
	inFlight atomic.Int32  // requests queued and not yet written
	idle     chan struct{} // signalled when inFlight falls to 0
	written  chan struct{} // closed when the writer has ended
}

// ahead is one request sent ahead: its reply, once done is closed.
type ahead struct {
	payload []byte
	reply   []byte
	done    chan struct{}
}

// batch is the submissions read together ahead of their replies, forwarded as one
// request: SUBMIT_JOBS when there are several, whose answers are the replies each would
// have had alone, byte for byte (PROTOCOL.md). So a client whose callers share its
// connection costs the coordinator one request for the submissions it sent together.
type batch struct {
	p     *pipe
	items []*ahead
}

// Run forwards the batch (on the bridge's pool) and ends each of its requests.
func (bt *batch) Run() {
	if len(bt.items) == 1 {
		bt.p.alone(bt.items[0])
	} else {
		bt.p.together(bt.items)
	}
	for _, a := range bt.items {
		a.payload = nil
		close(a.done)
	}
}

// alone forwards one submission and sets its reply.
func (p *pipe) alone(a *ahead) {
	reply, _, e := p.b.request(submitSubject, a.payload, p.log)
	if e != nil {
		reply = encodeError(e)
	}
	a.reply = reply
}

// together forwards items as one SUBMIT_JOBS and sets each reply from its answer.
func (p *pipe) together(items []*ahead) {
	jobs := make([]protocol.BatchedSubmission, len(items))
	for i, a := range items {
		jobs[i] = protocol.BatchedSubmission{RequestID: protocol.NewRequestID(), Submit: a.payload}
	}
	replies, answered := p.b.submitTogether(jobs, nil, p.log)
	if replies == nil { // not for payloads already decoded as SUBMIT_JOB; but never lose one
		for _, a := range items {
			p.alone(a)
		}
		return
	}
	if answered {
		p.b.settleOpen(jobs, replies, p.log)
	}
	for i, a := range items {
		a.reply = replies[i]
	}
}

// submitTogether forwards jobs as one SUBMIT_JOBS with header h and returns the reply
// to write for each, in order. answered reports that they are the coordinator's
// answers in its JOBS_SUBMITTED; otherwise each is the batch's refusal (refused whole,
// none of it acted on) or, with no answer or an unexpected one, "Outcome unknown"
// naming its own job. replies is nil when the batch cannot be encoded.
func (b *Bridge) submitTogether(jobs []protocol.BatchedSubmission, h nats.Header, log *slog.Logger) (replies []json.RawMessage, answered bool) {
	body, err := protocol.Encode(&protocol.SubmitJobs{Jobs: jobs})
	if err != nil {
		return nil, false
	}
	each := func(reply func(j protocol.BatchedSubmission) []byte) ([]json.RawMessage, bool) {
		replies = make([]json.RawMessage, len(jobs))
		for i, j := range jobs {
			replies[i] = reply(j)
		}
		return replies, false
	}
	msg, refused, err := b.forward(submitManySubject, body, "", h, log)
	switch {
	case refused != nil:
		return each(func(protocol.BatchedSubmission) []byte { return encodeError(refused) })
	case err != nil: // each says what it would have said alone, naming its job
		return each(func(j protocol.BatchedSubmission) []byte {
			return encodeError(b.unavailable(submitSubject, protocol.RequestJobID(j.RequestID), err))
		})
	}
	m, err := protocol.Decode(msg.Data)
	answers, ok := m.(*protocol.JobsSubmitted)
	switch {
	case err == nil && ok && len(answers.Answers) == len(jobs):
		return answers.Answers, true
	case err == nil && m.MessageType() == protocol.TypeError:
		// Refused whole, none of it acted on: each is refused so.
		return each(func(protocol.BatchedSubmission) []byte { return msg.Data })
	}
	log.Warn("unexpected answer to a batch of submissions", "answer", string(msg.Data), "err", err)
	return each(func(j protocol.BatchedSubmission) []byte {
		return encodeError(protocol.OutcomeUnknown("submission", protocol.RequestJobID(j.RequestID), "the coordinator's answer to its batch was unexpected"))
	})
}

// settleOpen sends the submissions of jobs whose answers in replies leave their
// outcomes open once more, together, and puts what that send hears in their places. A
// submission sent alone would be sent again under its request id until its outcome is
// known: so these are, once, marked as sends again so that the coordinator looks for
// the jobs the batch may have created. One without a request id keeps its answer:
// sent again, it would be a new job.
func (b *Bridge) settleOpen(jobs []protocol.BatchedSubmission, replies []json.RawMessage, log *slog.Logger) {
	var open []int
	for i, r := range replies {
		if jobs[i].RequestID != "" && unsettled(r) {
			open = append(open, i)
		}
	}
	if len(open) == 0 {
		return
	}
	again := make([]protocol.BatchedSubmission, len(open))
	for k, i := range open {
		again[k] = jobs[i]
	}
	h := nats.Header{protocol.HeaderRequestTry: []string{protocol.TryValue(2)}}
	if heard, _ := b.submitTogether(again, h, log); heard != nil {
		for k, i := range open {
			replies[i] = heard[k]
		}
	}
}

// settleBatch answers a client's own SUBMIT_JOBS as the bridge answers its batches
// (together): reply's answers that leave their outcomes open are settled (settleOpen).
// A reply other than a JOBS_SUBMITTED is returned as it is.
func (b *Bridge) settleBatch(payload, reply []byte, log *slog.Logger) []byte {
	if !bytes.Contains(reply, []byte(`"ERROR"`)) { // no answer is an ERROR: all settled
		return reply
	}
	answers, err := protocol.DecodeAs[protocol.JobsSubmitted](reply)
	if err != nil || !slices.ContainsFunc(answers.Answers, unsettled) {
		return reply
	}
	req, err := protocol.DecodeAs[protocol.SubmitJobs](payload)
	if err != nil || len(req.Jobs) != len(answers.Answers) {
		return reply
	}
	b.settleOpen(req.Jobs, answers.Answers, log)
	if out, err := protocol.Encode(answers); err == nil {
		return out
	}
	return reply
}

// unsettled reports whether a submission's answer in a batch leaves its outcome open:
// its coordinator stopped serving, or could not tell yet whether its job was stored.
func unsettled(answer json.RawMessage) bool {
	e, ok := protocol.AsError(answer)
	return ok && e.OutcomeOpen()
}

// busy reports whether replies are still to be written.
func (p *pipe) busy() bool { return p.inFlight.Load() != 0 }

// add queues a well-formed submission in the batch being gathered, which the reader
// hands over (dispatch) once no more frames wait, or before anything else.
func (p *pipe) add(payload []byte) {
	if len(p.queue) == cap(p.queue) || (p.gather != nil && len(p.gather.items) == batchMax) {
		p.dispatch() // the writer waits on the queue's first: it must be on its way
	}
	if p.gather == nil {
		p.gather = &batch{p: p}
	}
	a := &ahead{payload: append([]byte(nil), payload...), done: make(chan struct{})}
	p.gather.items = append(p.gather.items, a)
	p.enqueue(a)
}

// dispatch forwards the batch gathered, if any.
func (p *pipe) dispatch() {
	if p.gather != nil {
		p.b.deliveries.Run(p.gather)
		p.gather = nil
	}
}

// answer queues a reply that needs no request, behind those in flight.
func (p *pipe) answer(data []byte) {
	p.dispatch()
	a := &ahead{reply: data, done: make(chan struct{})}
	close(a.done)
	p.enqueue(a)
}

func (p *pipe) enqueue(a *ahead) {
	if p.queue == nil {
		p.queue = make(chan *ahead, aheadMax)
		p.idle = make(chan struct{}, 1)
		p.written = make(chan struct{})
		go p.write()
	}
	p.inFlight.Add(1)
	p.queue <- a
}

// drain waits until every queued reply was written (or dropped with the connection).
func (p *pipe) drain() {
	p.dispatch()
	for p.busy() {
		<-p.idle
	}
}

// close ends the writer once it has written what is queued; the connection is the
// caller's to close afterwards.
func (p *pipe) close() {
	p.dispatch()
	if p.queue != nil {
		close(p.queue)
		<-p.written
	}
}

// write writes the queued replies in order, each with those behind it already done,
// until the queue closes. After a failed write it closes the connection, which ends
// the reader, and waits out the requests still queued without writing their replies.
func (p *pipe) write() {
	defer close(p.written)
	var next *ahead
	broken := false
	for {
		a := next
		next = nil
		if a == nil {
			var ok bool
			if a, ok = <-p.queue; !ok {
				return
			}
		}
		<-a.done
		n := int32(1)
		buf, err := frame.Append(p.wbuf[:0], a.reply)
	more:
		for err == nil && len(buf) < batchBytes {
			select {
			case b, ok := <-p.queue:
				if !ok {
					break more
				}
				select {
				case <-b.done:
					buf, err = frame.Append(buf, b.reply)
					n++
				default:
					next = b
					break more
				}
			default:
				break more
			}
		}
		if cap(buf) <= batchBytes {
			p.wbuf = buf
		}
		if !broken && err == nil {
			err = p.writeOut(buf)
		}
		if err != nil && !broken {
			broken = true
			p.log.Info("client dropped: write failed", "err", err)
			_ = p.c.Close()
		}
		if p.inFlight.Add(-n) == 0 {
			select {
			case p.idle <- struct{}{}:
			default:
			}
		}
	}
}

func (p *pipe) writeOut(buf []byte) error {
	if err := p.wdl.arm(p.c.SetWriteDeadline, p.b.cfg.WriteTimeout); err != nil {
		return err
	}
	if _, err := p.c.Write(buf); err != nil {
		p.wdl.expired()
		return err
	}
	return nil
}
