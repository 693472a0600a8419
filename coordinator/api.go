package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/version"
)

// api serves the scheduler to workers (the bus handlers of the worker protocol) and to
// clients (the `jobbus` micro service, PROTOCOL.md's client-port JSON). It owns the bus
// node and the service, under a lock of its own, and withdraws both when the
// coordinator stops or is fenced (stop). Every handler answers only while the leader
// lease is certainly held (leaseclock.go).
type api struct {
	cfg   *Config
	nc    *nats.Conn
	log   *slog.Logger
	sched *scheduler
	reg   *registry
	lease *leaseClock
	store jobStore // whose health names why a lapsed lease cannot be renewed

	mu   sync.Mutex
	node *bus.Node
	svc  micro.Service
}

// serve registers the worker handlers on the bus and the client API service.
func (a *api) serve() error {
	// Envelope2: the worker protocol's tells and answers go without headers; every
	// worker reads them (bus.EnvelopeVersion).
	node, err := bus.New(a.nc, bus.Address{Role: bus.RoleCoordinator, ID: newID()[:8]}, bus.WithLogger(a.log),
		bus.WithEnvelope(bus.Envelope2))
	if err != nil {
		return fmt.Errorf("bus node: %w", err)
	}
	a.mu.Lock()
	a.node = node
	a.mu.Unlock()
	a.sched.sendThrough(node)
	if err := a.handleWorkers(); err != nil {
		return err
	}
	svc, err := micro.AddService(a.nc, micro.Config{
		Name:        protocol.ServiceName,
		Version:     version.String(),
		Description: "jobbus job coordinator: client API (PROTOCOL.md client-port JSON)",
		// Every coordinator subscribed gets every request, not one of a queue group: only
		// the leader serves, but a deposed one that is paused (SIGSTOP, a stalled VM)
		// stays subscribed until its server drops it, and in a queue group it would
		// swallow its share of the requests meant for its successor. Outside a failover
		// one coordinator is subscribed, and this changes nothing.
		QueueGroupDisabled: true,
	})
	if err != nil {
		return fmt.Errorf("api service: %w", err)
	}
	a.mu.Lock()
	a.svc = svc
	a.mu.Unlock()
	group := svc.AddGroup(protocol.APIPrefix)
	for _, e := range protocol.Endpoints {
		var opts []micro.EndpointOpt
		if e.Token != "" {
			opts = append(opts, micro.WithEndpointSubject(e.Token))
		}
		if err := group.AddEndpoint(e.Name, a.endpoint(e.Request), opts...); err != nil {
			return fmt.Errorf("api endpoint %s: %w", e.Name, err)
		}
	}
	// A writer may have fenced the coordinator during recovery, when there was nothing
	// yet for stop to withdraw.
	if fenced := a.sched.fencedBy(); fenced != nil {
		return fmt.Errorf("fenced while starting: %w", fenced)
	}
	return nil
}

func (a *api) handleWorkers() error {
	return errors.Join(
		// A batch of results (group commit) is served as its results would be one by
		// one, under one hold of the scheduler's lock, with one answer per result. It is
		// served first: a worker that finds no handler for batches where one for single
		// results answers takes the coordinator for one without batches
		// (workerproto.Results).
		handleWorker(a, protocol.PathResults, true, a.resultsDurable, resultSlots),
		handleWorker(a, protocol.PathRegister, true, func(_ context.Context, req *protocol.WorkerRegister) (*protocol.WorkerRegistered, error) {
			ans, err := a.reg.register(req)
			a.sched.out.flushed() // the mark in the answer counts only assignments sent before it
			return ans, err
		}),
		handleWorker(a, protocol.PathHeartbeat, true, func(_ context.Context, req *protocol.Heartbeat) (protocol.HeartbeatAck, error) {
			ack, err := a.reg.heartbeat(req)
			a.sched.out.flushed() // the mark in the answer counts only assignments sent before it
			return ack, err
		}),
		handleWorker(a, protocol.PathDrain, true, func(_ context.Context, req *protocol.Drain) (protocol.DrainAck, error) {
			return a.reg.drain(req)
		}),
		// A progress report is a tell; it changes no state (progress.go).
		handleWorker(a, protocol.PathProgress, true, func(_ context.Context, req *protocol.TaskProgress) (struct{}, error) {
			a.sched.progress(req)
			return struct{}{}, nil
		}),
		// A goodbye needs no lease: it only forgets the worker.
		handleWorker(a, protocol.PathDisconnect, false, func(_ context.Context, req *protocol.Disconnect) (struct{}, error) {
			a.reg.disconnect(req)
			return struct{}{}, nil
		}),
		// A result for an attempt this coordinator does not know may be for one granted
		// by a newer leader: it is refused (503, not final: the worker offers it again)
		// unless this one certainly leads, and so knows every attempt.
		handleWorker(a, protocol.PathResult, true, a.resultDurable, resultSlots),
	)
}

// resultSlots gives each results path handler slots of its own: a result's handler
// waits until its write is durable, and while the store stalls (a stream without a
// quorum, a store at its limit) more results than the node has slots can wait. On the
// node's slots they took them all, and heartbeats and registrations waited behind
// them, unanswered, until every worker was lost with its attempts.
var resultSlots = bus.OwnSlots(bus.DefaultMaxInFlight)

// workerRequest is a request of the worker protocol: it names its worker.
type workerRequest[T any] interface {
	*T
	Worker() string
}

// handleWorker serves path of the worker protocol with fn, for requests from the
// worker they name only (identity.go) and, with leased, only while this coordinator
// certainly holds the lease (leaseclock.go); opts add to bus.AsRole.
func handleWorker[Req any, PR workerRequest[Req], Resp any](a *api, path string, leased bool, fn func(context.Context, *Req) (Resp, error), opts ...bus.HandleOption) error {
	err := bus.Handle(a.node, path, func(ctx context.Context, from bus.Address, req Req) (Resp, error) {
		var none Resp
		if err := speaksFor(from, PR(&req).Worker()); err != nil {
			return none, err
		}
		if leased && !a.lease.held() {
			return none, leaseLapsed()
		}
		return fn(ctx, &req)
	}, append(opts, bus.AsRole())...)
	if err != nil {
		return fmt.Errorf("handle %s: %w", path, err)
	}
	return nil
}

// resultDurable applies a worker's result and answers once its outcome is durable.
func (a *api) resultDurable(ctx context.Context, req *protocol.TaskResult) (protocol.ResultAck, error) {
	type answer struct {
		ack protocol.ResultAck
		err error
	}
	done := make(chan answer, 1)
	a.sched.result(req, func(ack protocol.ResultAck, err error) { done <- answer{ack, err} })
	select {
	case ans := <-done:
		switch {
		case errors.Is(ans.err, bus.CodeForbidden): // another worker's attempt
			return ans.ack, ans.err
		case ans.err != nil: // not known durable: offer it again, here or to the next leader
			return ans.ack, bus.WithCode(bus.CodeUnavailable, ans.err)
		}
		// Stored: whoever leads next reads it, so it is acknowledged even if the lease
		// lapsed meanwhile (outcome.go). A stale result's "not accepted" needs no lease:
		// it changed nothing.
		return ans.ack, nil
	case <-ctx.Done():
		return protocol.ResultAck{}, bus.WithCode(bus.CodeUnavailable, ctx.Err())
	}
}

// resultsDurable applies a worker's batch of results and answers once each result's
// outcome is durable, or known not to be: one answer per result, each what
// resultDurable would have answered that result alone (an error travels as its code
// and text, for the worker to act on as it would on a single result's).
func (a *api) resultsDurable(ctx context.Context, req *protocol.TaskResults) (protocol.ResultAcks, error) {
	n := len(req.Results)
	if n > protocol.MaxResults {
		return protocol.ResultAcks{}, bus.Errorf(bus.CodeBadRequest, "a batch of %d results exceeds %d", n, protocol.MaxResults)
	}
	acks := protocol.ResultAcks{Acks: make([]protocol.ResultAnswer, n)}
	answered := make([]bool, n)
	type answer struct {
		i   int
		ack protocol.ResultAck
		err error
	}
	done := make(chan answer, n)
	results := make([]*protocol.TaskResult, 0, n)
	index := make([]int, 0, n) // results[k] is req.Results[index[k]]
	for i := range req.Results {
		res := &req.Results[i]
		if res.WorkerID != req.WorkerID { // each result speaks for the batch's worker only
			a.answerResult(&acks.Acks[i], res.JobID, protocol.ResultAck{JobID: res.JobID},
				bus.Errorf(bus.CodeForbidden, "forbidden: a batch of worker %s carries a result of worker %s", req.WorkerID, res.WorkerID))
			answered[i] = true
			continue
		}
		results = append(results, res)
		index = append(index, i)
	}
	if len(results) > 0 {
		a.sched.results(results, func(k int, ack protocol.ResultAck, err error) { done <- answer{index[k], ack, err} })
	}
	for left := len(results); left > 0; left-- {
		select {
		case ans := <-done:
			a.answerResult(&acks.Acks[ans.i], req.Results[ans.i].JobID, ans.ack, ans.err)
			answered[ans.i] = true
		case <-ctx.Done():
			for i, ok := range answered {
				if !ok { // not known durable in time: offered again
					a.answerResult(&acks.Acks[i], req.Results[i].JobID, protocol.ResultAck{JobID: req.Results[i].JobID},
						bus.WithCode(bus.CodeUnavailable, ctx.Err()))
				}
			}
			return acks, nil
		}
	}
	return acks, nil
}

// answerResult writes one result's answer in a batch's: as resultDurable would answer
// it alone, its error as a code and text.
func (a *api) answerResult(to *protocol.ResultAnswer, jobID string, ack protocol.ResultAck, err error) {
	*to = protocol.ResultAnswer{JobID: jobID, Accepted: ack.Accepted}
	switch {
	case err == nil:
		return
	case errors.Is(err, bus.CodeForbidden): // another worker's attempt
		to.Code = int(bus.CodeForbidden)
	default: // not known durable: offer it again, here or to the next leader
		to.Code = int(bus.CodeUnavailable)
	}
	to.Accepted = false
	to.Error = err.Error()
}

// endpoint is the handler of the endpoint for request type want: it serves that type
// only, so that NATS permissions per subject mean what the subjects say. An ERROR
// reply carries micro's error headers, so a caller can branch on the code (and a reply
// without them says the request decoded: the bridge relies on it, bridge/client.go); one given
// while the handler runs also counts in `nats micro stats`. A reply that comes later,
// from a writer once the outcome is durable, is published on the reply subject.
func (a *api) endpoint(want protocol.Type) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		if !a.lease.held() {
			// Another coordinator may lead: act on nothing, so that this ERROR means
			// what every ERROR means, nothing stored.
			data, e := encodeReply(a.notLeader())
			_ = req.Error(strconv.Itoa(errorCode(e)), errorHeader(e), data)
			return
		}
		r := &apiReply{a: a, req: req, want: want}
		a.serveRequest(req.Data(), a.sentBy(nats.Header(req.Headers())), want, r.send)
		r.mu.Lock()
		r.returned = true
		r.mu.Unlock()
	})
}

// apiReply sends the one reply to an API request: through micro while its handler
// runs, published on its reply subject once it returned. One allocation with its lock
// and flag (the closure it replaced took three a request).
type apiReply struct {
	a        *api
	req      micro.Request
	want     protocol.Type // the request's type
	mu       sync.Mutex
	returned bool // the handler returned
}

func (r *apiReply) send(m protocol.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m = r.a.answerNow(m)
	if r.returned {
		r.a.replyLate(r.req.Reply(), r.want, m)
		return
	}
	data, e := r.a.encodeFitting(m, r.want)
	if e != nil {
		_ = r.req.Error(strconv.Itoa(errorCode(e)), errorHeader(e), data)
		return
	}
	_ = r.req.Respond(data)
}

// answerNow is the API's answer m, as it goes now: a settled answer says what is
// stored, whoever leads (outcome.go); any other is "not serving" once the lease may
// have lapsed, for another coordinator may know better.
func (a *api) answerNow(m protocol.Message) protocol.Message {
	if s, ok := unsettle(m); ok {
		return s
	}
	if !a.lease.held() {
		return a.notLeader()
	}
	return m
}

// encodeReply encodes an API reply, and returns it as an ERROR too when it is one.
func encodeReply(m protocol.Message) ([]byte, *protocol.Error) {
	data, err := protocol.Encode(m)
	if err != nil {
		m = &protocol.Error{Message: "encode reply: " + err.Error()}
		data, _ = protocol.Encode(m)
	}
	e, _ := m.(*protocol.Error)
	return data, e
}

// encodeFitting encodes the reply m to a request of type want as encodeReply does, or,
// when it is larger than a NATS message on this server, an ERROR that says so: NATS
// refuses to send a message that large, and the caller, answered by nobody, would wait
// for its timeout and then hear "no reply" or "Outcome unknown". Replies are bounded
// where a part of one is useful (lists, a status's parents' results); this catches
// what no bound does.
func (a *api) encodeFitting(m protocol.Message, want protocol.Type) ([]byte, *protocol.Error) {
	data, e := encodeReply(m)
	max := a.nc.MaxPayload()
	if max <= 0 || int64(len(data)) <= max {
		return data, e
	}
	a.log.Warn("api reply larger than a NATS message", "request", want, "reply", m.MessageType(), "bytes", len(data), "max", max)
	return encodeReply(protocol.ReplyTooLarge(m.MessageType(), len(data), max, e == nil && !protocol.ReadOnly(want)))
}

// replyLate publishes a reply after the handler returned, with micro's error headers
// on an ERROR.
func (a *api) replyLate(subject string, want protocol.Type, m protocol.Message) {
	if subject == "" {
		return
	}
	data, e := a.encodeFitting(m, want)
	msg := &nats.Msg{Subject: subject, Data: data}
	if e != nil {
		msg.Header = nats.Header{}
		msg.Header.Set(micro.ErrorHeader, errorHeader(e))
		msg.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(errorCode(e)))
	}
	_ = a.nc.PublishMsg(msg)
}

// maxErrorHeader bounds the text of micro's error header on an ERROR reply.
const maxErrorHeader = 1024

// errorHeader is the text of micro's error header for ERROR e: its message, cut short
// past maxErrorHeader. The reply's body holds the message whole; the header is for a
// caller to branch on (errorCode's prefixes), and a message that echoes most of a
// request (a task type of 600,000 characters) would, held twice, make a reply larger
// than a NATS message, which is lost.
func errorHeader(e *protocol.Error) string { return protocol.Clip(e.Message, maxErrorHeader) }

// errorCode classifies an ERROR reply for micro's code header: 503 while this
// coordinator cannot serve (nothing was done), 504 for "Outcome unknown" (a write
// neither confirmed nor ruled out in time: a submission with a request id may be sent
// again, nothing else blindly), 404 for an unknown job, 400 for everything else a
// request got wrong.
func errorCode(e *protocol.Error) int {
	switch {
	case strings.HasPrefix(e.Message, ErrNotServing.Error()):
		return 503
	case strings.HasPrefix(e.Message, protocol.OutcomeUnknownPrefix):
		return 504
	case strings.HasPrefix(e.Message, protocol.UnknownJob("").Message),
		strings.HasPrefix(e.Message, protocol.UnknownSchedulePrefix), protocol.IsUnknownQueue(e.Message):
		return 404
	}
	return 400
}

// request is what a client API request's headers say of it.
type request struct {
	id    string // protocol.HeaderRequestID; "": none
	first bool   // its first send (protocol.HeaderRequestTry)
	// looked: the job of a send again was looked for among the finished ones, and not
	// found, when the last sequence given was since (request.go).
	looked bool
	since  uint64
	// due: a write is answered within it (protocol.HeaderTimeout; outcome.go).
	due time.Duration
	// The W3C trace context it carries, if any (trace.go).
	traceParent, traceState string
	// schedule names the schedule whose tick submits the job (schedules.go); "": a
	// client's submission.
	schedule string
}

func (a *api) sentBy(h nats.Header) request {
	r := request{id: h.Get(protocol.HeaderRequestID), first: protocol.FirstTry(h.Get(protocol.HeaderRequestTry)), due: a.replyDue(h)}
	r.traceParent, r.traceState = traceRequest(h.Get)
	return r
}

// serveRequest serves one request body, which must be of type want.
func (a *api) serveRequest(data []byte, from request, want protocol.Type, reply func(protocol.Message)) {
	msg, err := protocol.Decode(data)
	if err != nil {
		reply(protocol.MalformedRequest(err))
		return
	}
	if msg.MessageType() != want {
		e, _ := protocol.EndpointFor(want)
		reply(protocol.WrongEndpoint(msg.MessageType(), e.Subject()))
		return
	}
	switch m := msg.(type) {
	case *protocol.SubmitJob:
		a.sched.submit(m, from, reply)
	case *protocol.SubmitJobs:
		a.serveSubmits(m, from, reply) // submits.go
	case *protocol.GetJobStatus:
		reply(a.status(m.JobID))
	case *protocol.ListJobs:
		reply(a.list(m))
	case *protocol.ListWorkers:
		reply(&protocol.WorkerList{Workers: fitWorkers(a.reg.workerList())})
	case *protocol.CancelJob:
		a.sched.cancelJob(m.JobID, from.due, reply)
	case *protocol.ListTaskTypes:
		reply(a.sched.taskTypeList())
	case *protocol.AddSchedule, *protocol.ListSchedules, *protocol.PauseSchedule, *protocol.ResumeSchedule,
		*protocol.RemoveSchedule, *protocol.TriggerSchedule:
		a.sched.sch.serve(m, reply) // schedules.go
	case *protocol.ListQueues, *protocol.PauseQueue, *protocol.ResumeQueue, *protocol.SetQueue:
		a.serveQueues(m, from, reply) // queueapi.go
	case *protocol.SetLimit, *protocol.RemoveLimit, *protocol.ListLimits:
		a.sched.flow.serve(m, reply) // flow.go
	default:
		a.serveWorkflow(msg, from, reply) // workflow_api.go
	}
}

func (a *api) status(id string) protocol.Message {
	snap, err := a.sched.snapshot(id)
	switch {
	case errors.Is(err, errUnknownJob):
		return protocol.UnknownJob(id)
	case err != nil:
		return err.(*protocol.Error)
	}
	if len(snap.After) > 0 {
		fitParents(&snap, a.sched.parentResults(snap.After)) // deps.go
	}
	return &protocol.JobStatus{Job: snap}
}

// fitParents sets job's Parents to parents, leaving out the results that would make
// its JOB_STATUS larger than a NATS message, which would be lost and the request
// answered by nobody. Every parent stays, with its id and state; results are kept in
// the parents' order while they fit, and one left out is marked ResultOmitted (the
// parent's own status has it). Twenty parents of 64 KiB results already fill a message.
func fitParents(job *protocol.Job, parents []protocol.ParentResult) {
	job.Parents = nil
	budget := listBudget - snapshotSize(job)
	bare := make([]int, len(parents)) // a parent's bytes with its result left out
	for i := range parents {
		p := parents[i]
		p.Result, p.ResultOmitted = nil, p.Result != nil
		bare[i] = parentSize(&p)
		budget -= bare[i]
	}
	for i := range parents {
		p := &parents[i]
		if p.Result == nil {
			continue
		}
		if more := parentSize(p) - bare[i]; more <= budget {
			budget -= more
			continue
		}
		p.Result, p.ResultOmitted = nil, true
	}
	job.Parents = parents
}

// parentSize is the bytes a parent adds to a job's snapshot, its comma included.
func parentSize(p *protocol.ParentResult) int {
	b, _ := json.Marshal(p)
	return len(b) + 1
}

// list returns jobs newest first, filtered by state, from the cursor (a sequence number),
// at most limit of them and never more than fit in one reply. Active jobs come from
// memory, finished ones from KV: a page costs its own jobs, not every stored one.
func (a *api) list(req *protocol.ListJobs) protocol.Message {
	var from uint64 = 1<<64 - 1
	if req.Cursor != "" {
		n, err := strconv.ParseUint(req.Cursor, 10, 64)
		if err != nil {
			return &protocol.Error{Message: fmt.Sprintf("Invalid cursor: %q", req.Cursor)}
		}
		from = n
	}
	var state protocol.State // "" lists every state
	if req.State != nil {
		st, err := protocol.ParseState(string(*req.State))
		if err != nil {
			return &protocol.Error{Message: "Invalid state: " + err.Error()}
		}
		state = st
	}
	limit := req.Limit
	if limit <= 0 {
		limit = int(^uint(0) >> 1)
	}
	// Exact sizes are measured outside the lock: encoding thousands of snapshots must
	// not hold up scheduling. A finished job that expired since it was picked is left
	// out, and picking goes on below it.
	out := &protocol.JobList{}
	budget := listBudget
	var lastSeq uint64
	more := true
	for more {
		picked, left, refusal := a.sched.pick(from, state, limit-len(out.Jobs))
		if refusal != nil {
			return refusal
		}
		more = left
		if len(picked) == 0 {
			break
		}
		from = picked[len(picked)-1].seq
		a.readFinished(picked)
		for _, p := range picked {
			if p.gone {
				continue
			}
			size := snapshotSize(&p.snap)
			if size > budget {
				more, budget = true, 0
				break
			}
			budget -= size
			out.Jobs = append(out.Jobs, p.snap)
			lastSeq = p.seq
		}
		if len(out.Jobs) == limit || budget == 0 {
			break
		}
	}
	// A cursor only for callers that page; a spec peer gets the newest jobs that fit.
	if more && lastSeq != 0 && (req.Limit > 0 || req.Cursor != "") {
		out.NextCursor = strconv.FormatUint(lastSeq, 10)
	}
	return out
}

// listBudget is what a JOB_LIST may spend on snapshots: all of a message but the
// envelope and a cursor.
const listBudget = protocol.MaxMessage - 128

// fitWorkers is the start of workers (sorted by id) that fits in one WORKER_LIST, as a
// JOB_LIST holds the newest jobs that fit: a reply larger than a NATS message would be
// lost, and the request answered by nobody.
func fitWorkers(workers []protocol.Worker) []protocol.Worker {
	budget := listBudget
	for i := range workers {
		data, err := json.Marshal(&workers[i])
		if err != nil || len(data)+1 > budget { // +1: the comma before it
			return workers[:i]
		}
		budget -= len(data) + 1
	}
	return workers
}

// listed is a job picked for a list: its snapshot, or, for a finished job, its id to
// read (gone once it turned out to have expired).
type listed struct {
	snap protocol.Job
	seq  uint64
	id   string // set while snap is still to be read from KV
	gone bool
}

// readFinished reads the records of the finished jobs picked, a few at a time.
func (a *api) readFinished(picked []listed) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range picked {
		if picked[i].id == "" {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(p *listed) {
			defer func() { <-sem; wg.Done() }()
			snap, err := a.sched.readSnapshot(p.id)
			p.snap, p.gone = snap, err != nil
		}(&picked[i])
	}
	wg.Wait()
}

// minSnapshotSize is at most the encoded size of s: its strings unescaped, and fewer
// bytes than its keys and punctuation take.
func minSnapshotSize(s *protocol.Job) int {
	n := 100 + len(s.JobID) + len(s.TaskType) + len(s.State) + len(s.Priority)
	for _, p := range []*string{s.WorkerID, s.Result, s.Error} {
		if p != nil {
			n += len(*p)
		}
	}
	return n
}

// snapshotSize is the bytes a snapshot adds to a JOB_LIST, its comma included.
func snapshotSize(s *protocol.Job) int {
	b, _ := json.Marshal(s)
	return len(b) + 1
}

// stop withdraws the API and the worker handlers, so that clients and workers reach a
// coordinator whose memory is the truth, or none.
func (a *api) stop() {
	a.mu.Lock()
	svc, node := a.svc, a.node
	a.mu.Unlock()
	if svc != nil {
		_ = svc.Stop()
	}
	if node != nil {
		_ = node.Close()
	}
}

// stats are the bus node's counters, and whether it still serves.
func (a *api) stats() (bus.Stats, bool) {
	a.mu.Lock()
	node := a.node
	a.mu.Unlock()
	if node == nil {
		return bus.Stats{}, false
	}
	select {
	case <-node.Done():
		return node.Stats(), false
	default:
		return node.Stats(), true
	}
}
