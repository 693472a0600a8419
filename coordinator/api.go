package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/version"
)

// serve registers the worker handlers on the bus and the client API service.
func (c *Coordinator) serve() error {
	node, err := bus.New(c.nc, bus.Address{Role: bus.RoleCoordinator, ID: newID()[:8]}, bus.WithLogger(c.log))
	if err != nil {
		return fmt.Errorf("bus node: %w", err)
	}
	c.mu.Lock()
	c.node = node
	c.unlock()
	if err := c.handleWorkers(); err != nil {
		return err
	}
	svc, err := micro.AddService(c.nc, micro.Config{
		Name:        protocol.ServiceName,
		Version:     version.String(),
		Description: "jobbus job coordinator: client API (PROTOCOL.md client-port JSON)",
	})
	if err != nil {
		return fmt.Errorf("api service: %w", err)
	}
	c.mu.Lock()
	c.svc = svc
	c.unlock()
	group := svc.AddGroup(protocol.APIPrefix)
	for _, e := range protocol.Endpoints {
		if err := group.AddEndpoint(e.Name, c.endpoint(e.Request)); err != nil {
			return fmt.Errorf("api endpoint %s: %w", e.Name, err)
		}
	}
	// A writer may have fenced the coordinator during recovery, when there was nothing
	// yet for stopServing to withdraw.
	c.mu.Lock()
	fenced := c.fenced
	c.unlock()
	if fenced != nil {
		return fmt.Errorf("fenced while starting: %w", fenced)
	}
	return nil
}

func (c *Coordinator) handleWorkers() error {
	return errors.Join(
		handleWorker(c, protocol.PathRegister, true, func(_ context.Context, req *protocol.WorkerRegister) (*protocol.WorkerRegistered, error) {
			ans, err := c.register(req)
			c.flushed() // the mark in the answer counts only assignments sent before it
			return ans, err
		}),
		handleWorker(c, protocol.PathHeartbeat, true, func(_ context.Context, req *protocol.Heartbeat) (protocol.HeartbeatAck, error) {
			ack, err := c.heartbeat(req)
			c.flushed() // the mark in the answer counts only assignments sent before it
			return ack, err
		}),
		handleWorker(c, protocol.PathDrain, true, func(_ context.Context, req *protocol.Drain) (protocol.DrainAck, error) {
			return c.drain(req)
		}),
		// A goodbye needs no lease: it only forgets the worker.
		handleWorker(c, protocol.PathDisconnect, false, func(_ context.Context, req *protocol.Disconnect) (struct{}, error) {
			c.disconnect(req)
			return struct{}{}, nil
		}),
		// A result for an attempt this coordinator does not know may be for one granted
		// by a newer leader: it is refused (503, not final: the worker offers it again)
		// unless this one certainly leads, and so knows every attempt.
		handleWorker(c, protocol.PathResult, true, c.resultDurable),
	)
}

// workerRequest is a request of the worker protocol: it names its worker.
type workerRequest[T any] interface {
	*T
	Worker() string
}

// handleWorker serves path of the worker protocol with fn, for requests from the
// worker they name only (identity.go) and, with leased, only while this coordinator
// certainly holds the lease (leaseclock.go).
func handleWorker[Req any, PR workerRequest[Req], Resp any](c *Coordinator, path string, leased bool, fn func(context.Context, *Req) (Resp, error)) error {
	err := bus.Handle(c.node, path, func(ctx context.Context, from bus.Address, req Req) (Resp, error) {
		var none Resp
		if err := speaksFor(from, PR(&req).Worker()); err != nil {
			return none, err
		}
		if leased && !c.lease.held() {
			return none, leaseLapsed()
		}
		return fn(ctx, &req)
	}, bus.AsRole())
	if err != nil {
		return fmt.Errorf("handle %s: %w", path, err)
	}
	return nil
}

// resultDurable applies a worker's result and answers once its outcome is durable.
func (c *Coordinator) resultDurable(ctx context.Context, req *protocol.TaskResult) (protocol.ResultAck, error) {
	type answer struct {
		ack protocol.ResultAck
		err error
	}
	done := make(chan answer, 1)
	c.result(req, func(ack protocol.ResultAck, err error) { done <- answer{ack, err} })
	select {
	case a := <-done:
		switch {
		case errors.Is(a.err, bus.CodeForbidden): // another worker's attempt
			return a.ack, a.err
		case a.err != nil: // not known durable: offer it again, here or to the next leader
			return a.ack, bus.WithCode(bus.CodeUnavailable, a.err)
		}
		// Stored: whoever leads next reads it, so it is acknowledged even if the lease
		// lapsed meanwhile (outcome.go). A stale result's "not accepted" needs no lease:
		// it changed nothing.
		return a.ack, nil
	case <-ctx.Done():
		return protocol.ResultAck{}, bus.WithCode(bus.CodeUnavailable, ctx.Err())
	}
}

// endpoint is the handler of the endpoint for request type want: it serves that type
// only, so that NATS permissions per subject mean what the subjects say. An ERROR
// reply carries micro's error headers, so a caller can branch on the code (and a reply
// without them says the request decoded: the bridge relies on it, bridge/client.go); one given
// while the handler runs also counts in `nats micro stats`. A reply that comes later,
// from a writer once the outcome is durable, is published on the reply subject.
func (c *Coordinator) endpoint(want protocol.Type) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		if !c.lease.held() {
			// Another coordinator may lead: act on nothing, so that this ERROR means
			// what every ERROR means, nothing stored.
			data, e := encodeReply(c.notLeader())
			_ = req.Error(strconv.Itoa(errorCode(e)), e.Message, data)
			return
		}
		var mu sync.Mutex
		returned := false
		c.serveRequest(req.Data(), want, c.replyDue(nats.Header(req.Headers())), func(m protocol.Message) {
			mu.Lock()
			defer mu.Unlock()
			if s, ok := m.(settled); ok {
				m = s.Message // what is stored, whoever leads (outcome.go)
			} else if !c.lease.held() {
				m = c.notLeader() // a read: another coordinator may know better
			}
			if returned {
				c.replyLate(req.Reply(), m)
				return
			}
			data, e := encodeReply(m)
			if e != nil {
				_ = req.Error(strconv.Itoa(errorCode(e)), e.Message, data)
				return
			}
			_ = req.Respond(data)
		})
		mu.Lock()
		returned = true
		mu.Unlock()
	})
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

// replyLate publishes a reply after the handler returned, with micro's error headers
// on an ERROR.
func (c *Coordinator) replyLate(subject string, m protocol.Message) {
	if subject == "" {
		return
	}
	data, e := encodeReply(m)
	msg := &nats.Msg{Subject: subject, Data: data}
	if e != nil {
		msg.Header = nats.Header{}
		msg.Header.Set(micro.ErrorHeader, e.Message)
		msg.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(errorCode(e)))
	}
	_ = c.nc.PublishMsg(msg)
}

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
	case strings.HasPrefix(e.Message, protocol.UnknownJob("").Message):
		return 404
	}
	return 400
}

// serveRequest serves one request body, which must be of type want; a write is
// answered within due (outcome.go).
func (c *Coordinator) serveRequest(data []byte, want protocol.Type, due time.Duration, reply func(protocol.Message)) {
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
		c.submit(m, due, reply)
	case *protocol.GetJobStatus:
		reply(c.status(m.JobID))
	case *protocol.ListJobs:
		reply(c.list(m))
	case *protocol.ListWorkers:
		reply(&protocol.WorkerList{Workers: c.workerList()})
	case *protocol.CancelJob:
		c.cancelJob(m.JobID, due, reply)
	case *protocol.ListTaskTypes:
		reply(c.taskTypeList())
	}
}

func (c *Coordinator) status(id string) protocol.Message {
	snap, err := c.snapshot(id)
	switch {
	case errors.Is(err, errUnknownJob):
		return protocol.UnknownJob(id)
	case err != nil:
		return err.(*protocol.Error)
	}
	return &protocol.JobStatus{Job: snap}
}

// errUnknownJob: no job of that id is kept.
var errUnknownJob = errors.New("unknown job")

// snapshot is job id's snapshot: from memory while it is active, else from its record in
// KV. The error is errUnknownJob, or a *protocol.Error to answer.
func (c *Coordinator) snapshot(id string) (protocol.Job, error) {
	c.mu.Lock()
	var refusal *protocol.Error
	if c.fenced != nil {
		refusal = c.refuse()
	}
	j := c.jobs[id]
	var snap protocol.Job
	if j != nil {
		snap = j.snapshot()
	}
	c.unlock()
	switch {
	case refusal != nil:
		return snap, refusal
	case j != nil:
		return snap, nil
	}
	return c.readSnapshot(id)
}

// readSnapshot reads a finished job's record from KV. A record whose job this
// coordinator no longer keeps (its retention ended; JetStream's own expiry may lag or
// lead by a moment) is unknown, so status, lists and idempotency keys agree.
func (c *Coordinator) readSnapshot(id string) (protocol.Job, error) {
	if !protocol.IsRecordKey(id) {
		return protocol.Job{}, errUnknownJob
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	data, err := c.readRecord(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted), errors.Is(err, jetstream.ErrInvalidKey):
		return protocol.Job{}, errUnknownJob
	case err != nil:
		return protocol.Job{}, &protocol.Error{Message: fmt.Sprintf("read job %s: %v", id, err)}
	}
	var r protocol.Record
	if err := json.Unmarshal(data, &r); err != nil {
		return protocol.Job{}, &protocol.Error{Message: fmt.Sprintf("read job %s: %v", id, err)}
	}
	c.mu.Lock()
	kept := c.index.find(r.Seq)
	known := kept != nil && c.index.hasID(kept, id)
	c.unlock()
	if !known {
		return protocol.Job{}, errUnknownJob
	}
	return r.Snapshot(), nil
}

// list returns jobs newest first, filtered by state, from the cursor (a sequence number),
// at most limit of them and never more than fit in one reply. Active jobs come from
// memory, finished ones from KV: a page costs its own jobs, not every stored one.
func (c *Coordinator) list(req *protocol.ListJobs) protocol.Message {
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
		picked, left, refusal := c.pick(from, state, limit-len(out.Jobs))
		if refusal != nil {
			return refusal
		}
		more = left
		if len(picked) == 0 {
			break
		}
		from = picked[len(picked)-1].seq
		c.readFinished(picked)
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

// listed is a job picked for a list: its snapshot, or, for a finished job, its id to
// read (gone once it turned out to have expired).
type listed struct {
	snap protocol.Job
	seq  uint64
	id   string // set while snap is still to be read from KV
	gone bool
}

// pick takes, newest first, up to limit jobs below sequence from in state (any if ""),
// stopping early once even a lower bound of their size exceeds the list budget. more
// reports that matching jobs were left.
func (c *Coordinator) pick(from uint64, state protocol.State, limit int) (picked []listed, more bool, refusal protocol.Message) {
	c.mu.Lock()
	defer c.unlock()
	if c.fenced != nil {
		return nil, false, c.refuse()
	}
	least := 0
	for i := c.index.below(from) - 1; i >= 0; i-- {
		e := &c.index.entries[i]
		if !e.live() {
			continue
		}
		st := e.state()
		if e.j != nil {
			st = e.j.rec.State
		}
		if state != "" && st != state {
			continue
		}
		if len(picked) == limit || least > listBudget {
			return picked, true, nil
		}
		p := listed{seq: e.seq}
		switch {
		case e.j != nil:
			p.snap = e.j.snapshot()
		case e.snap != nil:
			p.snap = *e.snap
		default:
			id := c.index.id(e)
			p.id, p.snap = id, protocol.Job{JobID: id, State: st}
		}
		least += minSnapshotSize(&p.snap)
		picked = append(picked, p)
	}
	return picked, false, nil
}

// readFinished reads the records of the finished jobs picked, a few at a time.
func (c *Coordinator) readFinished(picked []listed) {
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
			snap, err := c.readSnapshot(p.id)
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
