package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/internal/backoff"
)

// ErrNotSent is the result of a submission of SubmitMany that was never sent, because
// a request before it failed as a whole: no job was created for it.
var ErrNotSent = errors.New("submission not sent")

// A Submission is one job of SubmitMany: what Submit takes.
type Submission struct {
	TaskType string
	Payload  any // JSON-encoded unless it is already json.RawMessage
	Options  []SubmitOption
}

// SubmitResult is one submission's outcome in SubmitMany: its job's id, or the error
// Submit would have returned for it alone (*RejectedError, a *ServerError, an
// ErrOutcomeUnknown naming its own job, ...).
type SubmitResult struct {
	JobID string
	Err   error
}

// SubmitMany submits several jobs in one request (SUBMIT_JOBS on
// jobbus.api.submit.many), each served exactly as if Submit had sent it alone, and
// returns one result per submission, in order. It costs the coordinator one request
// and one reply for many jobs; the jobs are independent: some may be created and
// others not (a rejection at a limit, an invalid task type), and results say which.
//
// More than protocol.MaxSubmissions submissions, or more than a message holds, go in
// several requests, one after the other, each bounded as any request is (WithTimeout).
// A retryable rejection is resubmitted as Submit resubmits it (WithSubmitRetries): the
// rejected submissions only, together. A submission whose answer leaves its outcome
// open (its coordinator stopped serving, or could not tell yet whether the job was
// stored, as in a failover) is sent once more under its request id, marked as a send
// again, as Submit sends it again: it hears its job, or that none was made, and is
// "Outcome unknown" naming its job only if that answer leaves it open too.
//
// The error is nil when every submission got its own answer. It is not nil when a
// request failed as a whole: no coordinator, ctx ended, an ERROR for the whole batch,
// or no answer in time (errors.Is(err, ErrOutcomeUnknown)). SubmitMany stops there;
// results still hold every submission's outcome: those of the failed request have the
// error each would have had alone (for one left unanswered, "Outcome unknown" naming
// its own job, which OutcomeJob returns), and those after it ErrNotSent.
//
// Where nobody serves submit.many when a request goes (a coordinator older than it,
// or none at that moment, as in a failover), that request's submissions and the rest
// go alone, one after the other, as Submit sends them (waiting out a failover as it
// does). Over the TCP transport the batch goes through the bridge's client port, which
// forwards it; from a bridge that finds nobody serving submit.many, that answer comes
// only after the bridge's request timeout.
func (c *Client) SubmitMany(ctx context.Context, subs []Submission) (results []SubmitResult, err error) {
	if len(subs) == 0 {
		return nil, nil
	}
	if c.tracer.On() {
		var end func(string, error)
		ctx, end = c.submitSpan(ctx, commonTaskType(subs), attribute.Int("messaging.batch.message_count", len(subs)))
		defer func() { end("", err) }()
	}
	results = make([]SubmitResult, len(subs))
	items := make([]batchItem, 0, len(subs))
	for i, s := range subs {
		req, err := submission(s.TaskType, s.Payload, s.Options)
		if err == nil {
			var body []byte
			if body, err = protocol.Encode(req); err == nil {
				items = append(items, batchItem{i: i, req: req, body: body})
				continue
			}
		}
		results[i].Err = err // as Submit, before it sends anything
	}
	for try := 0; len(items) > 0; try++ {
		rejected, open, err := c.submitAll(ctx, items, results)
		if err == nil && len(open) > 0 && c.marksSendsAgain() {
			// Their coordinator stopped serving, or could not tell yet, while their
			// jobs' writes went on: sent once more under their request ids, marked as
			// sends again, each hears its job or that none was made, as a submission
			// alone does (natsreq). Over TCP, which carries no such mark, the bridge
			// sends them again itself.
			var again []batchItem
			again, _, err = c.submitAll(withSendAgain(ctx), open, results)
			rejected = append(rejected, again...)
		}
		if err != nil {
			return results, err
		}
		if len(rejected) == 0 || try >= c.retry.n {
			return results, nil
		}
		if !backoff.Sleep(ctx, c.retry.backoff(try)) {
			for _, it := range rejected {
				results[it.i].Err = fmt.Errorf("%w (gave up retrying after %d attempts: %w)", results[it.i].Err, try+1, ctx.Err())
			}
			return results, nil
		}
		items = rejected
	}
	return results, nil
}

// batchItem is one submission of SubmitMany on its way: its index in the call, its
// request and its encoding, and the request id it goes under.
type batchItem struct {
	i    int
	req  *protocol.SubmitJob
	body []byte
	rid  string
}

// submitAll submits items in as few requests as the limits allow, one after another,
// and writes each outcome into results. It returns the items rejected as retryable
// (to resubmit under new request ids), those whose outcome their answer left open (to
// send again under theirs), and the error of a request that failed as a whole. Items
// sent again (withSendAgain) keep their request ids.
func (c *Client) submitAll(ctx context.Context, items []batchItem, results []SubmitResult) (rejected, open []batchItem, err error) {
	limit, again := c.batchBytes(), sentAgain(ctx)
	for len(items) > 0 {
		n, size := 0, len(`{"type":"SUBMIT_JOBS","jobs":[]}`)
		for n < len(items) && n < protocol.MaxSubmissions {
			if !again {
				items[n].rid = protocol.NewRequestID() // fresh at each try: a rejection created no job
			}
			s := itemSize(&items[n])
			if n > 0 && size+s > limit {
				break
			}
			size += s
			n++
		}
		batch := items[:n]
		items = items[n:]
		r, o, err := c.submitBatch(ctx, batch, results)
		rejected, open = append(rejected, r...), append(open, o...)
		switch {
		case errors.Is(err, errNoBatches) && again:
			// Nobody serves submit.many now (mid-failover): alone, under new request
			// ids, they could be made twice; each keeps its "Outcome unknown".
			return rejected, open, nil
		case errors.Is(err, errNoBatches):
			// Nobody serves submit.many: each goes alone, as Submit sends it.
			return rejected, open, c.submitAlone(ctx, append(batch, items...), results)
		}
		if err != nil {
			if !again { // sent before, the rest keep their "Outcome unknown"
				notSent(items, results, err)
			}
			return rejected, open, err
		}
	}
	return rejected, open, nil
}

// errNoBatches: nobody received a batch (nobody serves jobbus.api.submit.many).
var errNoBatches = errors.New("no coordinator serves batches of submissions")

// submitBatch sends one SUBMIT_JOBS of batch and writes each answer into results. It
// returns the items rejected as retryable, those whose outcome their answer left open,
// errNoBatches when nobody received it, and the error of a batch that failed as a
// whole (each item's result then says what it would have been alone).
func (c *Client) submitBatch(ctx context.Context, batch []batchItem, results []SubmitResult) (rejected, open []batchItem, err error) {
	req := &protocol.SubmitJobs{Jobs: make([]protocol.BatchedSubmission, len(batch))}
	for k, it := range batch {
		req.Jobs[k] = protocol.BatchedSubmission{RequestID: it.rid, Submit: it.body}
	}
	m, err := c.Do(ctx, req)
	var unanswered *batchUnanswered
	switch {
	case errors.Is(err, ErrNoCoordinator):
		return nil, nil, errNoBatches
	case errors.As(err, &unanswered):
		for _, it := range batch {
			results[it.i].Err = &ServerError{Message: protocol.OutcomeUnknown("submission", protocol.RequestJobID(it.rid), unanswered.cause).Message}
		}
		return nil, nil, err
	case err != nil && sentAgain(ctx):
		// Its submissions were sent before, and answered that their outcome was open:
		// whatever kept this send from an answer (ctx ended before it went, say), that
		// "Outcome unknown" still holds.
		return nil, nil, err
	case err != nil:
		// Nothing was received (ctx ended first, the connection is down) or no reply
		// came that the transport could read: each says what its send said.
		for _, it := range batch {
			results[it.i].Err = err
		}
		return nil, nil, err
	}
	switch r := m.(type) {
	case *protocol.JobsSubmitted:
		if len(r.Answers) != len(batch) {
			err = fmt.Errorf("%s: %d answers to %d submissions", protocol.TypeJobsSubmitted, len(r.Answers), len(batch))
			break
		}
		for k, it := range batch {
			switch retry, unsure := c.answerItem(r.Answers[k], it.rid, &results[it.i]); {
			case retry:
				rejected = append(rejected, it)
			case unsure:
				open = append(open, it)
			}
		}
		return rejected, open, nil
	case *protocol.Error: // the whole batch's
		err = &ServerError{Message: r.Message}
		switch {
		case errors.Is(err, ErrOutcomeUnknown):
			// The bridge's word for a batch it sent and heard no answer to: each job
			// is named as its own submission's would be.
			for _, it := range batch {
				results[it.i].Err = &ServerError{Message: protocol.OutcomeUnknown("submission", protocol.RequestJobID(it.rid), "its batch's answer: "+r.Message).Message}
			}
			return nil, nil, err
		case errors.Is(err, ErrNoCoordinator): // the bridge's: nobody received it
			return nil, nil, errNoBatches
		}
		for _, it := range batch { // refused whole: none of it was acted on
			results[it.i].Err = err
		}
		return nil, nil, err
	default:
		err = unexpected(m)
	}
	// Not an answer to the batch: any of its jobs may exist.
	for _, it := range batch {
		results[it.i].Err = &ServerError{Message: protocol.OutcomeUnknown("submission", protocol.RequestJobID(it.rid), "unexpected answer to its batch: "+err.Error()).Message}
	}
	return nil, nil, err
}

// answerItem writes one submission's answer in a JOBS_SUBMITTED into res, as Submit
// would have returned it, and reports whether it is a retryable rejection, or an
// answer that leaves the submission's outcome open (its job may be stored; res then
// says "Outcome unknown" naming it). rid is the submission's request id.
func (c *Client) answerItem(a json.RawMessage, rid string, res *SubmitResult) (retry, open bool) {
	m, err := protocol.Decode(a)
	if err != nil {
		res.Err = fmt.Errorf("%s: %w", protocol.TypeJobsSubmitted, err)
		return false, false
	}
	if e, ok := m.(*protocol.Error); ok && e.OutcomeOpen() {
		if strings.HasPrefix(e.Message, protocol.NotServingPrefix) {
			// Its coordinator lost its lease while the job's write went on: alone, it
			// would be sent again under its request id; until it is, its outcome is
			// unknown, and named.
			e = protocol.OutcomeUnknown("submission", protocol.RequestJobID(rid),
				"its coordinator stopped serving before it answered ("+e.Message+")")
		}
		res.JobID, res.Err = "", &ServerError{Message: e.Message}
		return false, true
	}
	res.JobID, res.Err = submitted(m)
	r, rejected := m.(*protocol.SubmitRejected)
	return rejected && r.Retryable, false
}

// submitAlone submits each item alone, as Submit does (with its retries), for a
// coordinator that serves no batches. It returns the error of a submission that
// failed as a whole, after which the others are not sent (with no coordinator at all,
// each has that error).
func (c *Client) submitAlone(ctx context.Context, items []batchItem, results []SubmitResult) error {
	for k, it := range items {
		m, err := c.submit(ctx, it.req)
		res := &results[it.i]
		if err != nil {
			res.Err = err
			notSent(items[k+1:], results, err)
			return err
		}
		res.JobID, res.Err = submitted(m)
	}
	return nil
}

// notSent ends the items a failed request kept from being sent: with its error if it
// found no coordinator at all (theirs would have too), else with ErrNotSent.
func notSent(items []batchItem, results []SubmitResult, err error) {
	for _, it := range items {
		if errors.Is(err, ErrNoCoordinator) {
			results[it.i].Err = err
			continue
		}
		results[it.i].Err = fmt.Errorf("%w: an earlier request of the call failed: %v", ErrNotSent, err)
	}
}

// marksSendsAgain reports whether the transport can mark a request as a send again
// (withSendAgain): NATS carries it in a header; a TCP frame has none.
func (c *Client) marksSendsAgain() bool {
	_, ok := c.tr.(*natsTransport)
	return ok
}

// sendAgainKey marks a context whose SUBMIT_JOBS sends its submissions again, under
// the request ids of an earlier send (natsTransport.request).
type sendAgainKey struct{}

func withSendAgain(ctx context.Context) context.Context {
	return context.WithValue(ctx, sendAgainKey{}, true)
}

func sentAgain(ctx context.Context) bool { return ctx.Value(sendAgainKey{}) != nil }

// batchBytes bounds a batch's body: what its transport carries, less room for headers.
func (c *Client) batchBytes() int {
	const headroom = 4 << 10
	if n, ok := c.tr.(*natsTransport); ok {
		if max := int(n.nc.MaxPayload()); max > 0 {
			return max - headroom
		}
	}
	return frame.MaxSize - headroom
}

// batchUnanswered ends a batch of submissions that was sent and left unanswered (see
// natsTransport.request): any of its jobs may exist, and SubmitMany names each.
type batchUnanswered struct {
	cause string
	err   error // context.Canceled when the caller gave up on it, else nil
}

func (e *batchUnanswered) Error() string {
	return protocol.OutcomeUnknownUnanswered("batch of submissions", e.cause).Message
}

// Is matches ErrOutcomeUnknown.
func (e *batchUnanswered) Is(target error) bool { return target == ErrOutcomeUnknown }

// Unwrap is context.Canceled when the caller cancelled the batch.
func (e *batchUnanswered) Unwrap() error { return e.err }

// itemSize bounds its size in a batch: {"requestId":"...","submit":...}, and a comma.
func itemSize(it *batchItem) int { return len(it.rid) + len(it.body) + 30 }

// commonTaskType is the task type of every submission in subs, "" when they differ.
func commonTaskType(subs []Submission) string {
	for _, s := range subs[1:] {
		if s.TaskType != subs[0].TaskType {
			return ""
		}
	}
	return subs[0].TaskType
}
