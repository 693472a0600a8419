package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/internal/backoff"
	"github.com/jobbus/jobbus/internal/natsreq"
	"github.com/jobbus/jobbus/internal/workerproto"
)

const (
	// causeClosed is the loss cause the coordinator records for a TCP worker whose
	// connection ended: jobs fail over with "worker <id> lost (connection closed)".
	causeClosed = "connection closed"
	// A session stops reading while this many results, or this many bytes of them,
	// wait for the coordinator's answer, so that a flood of results costs bounded
	// memory; TCP then holds the peer back. The count cannot be derived from capacity:
	// the coordinator frees a slot, and assigns it again, before the result is durable.
	maxPendingResults     = 256
	maxPendingResultBytes = 8 << 20
)

// resultRetry is the backoff between offers of a result the coordinator did not answer.
var resultRetry = backoff.Policy{Base: 50 * time.Millisecond, Max: 2 * time.Second}

// resultAsks is how many asks of a TCP worker's results may be in flight at once:
// results that arrive meanwhile wait and go together in the next (workerproto.Results),
// as a native worker's do.
const resultAsks = 2

// workerSession is one worker-port connection. Its goroutine (serveWorker) owns the
// reading; the outbox's goroutine owns the writing; bus handlers and heartbeat and
// result goroutines only queue frames or ask the coordinator.
type workerSession struct {
	b      *Bridge
	conn   net.Conn
	reader *frame.Reader
	readDL deadline // the connection's read deadline, which only the reader arms
	out    *outbox
	log    *slog.Logger

	reg  protocol.WorkerRegister // the registration, replayed when the coordinator forgets the worker
	node *bus.Node               // the worker's own bus node, on the bridge's connection
	// regBytes is the size of the worker's WORKER_REGISTER frame, said when its
	// registration is too large to forward.
	regBytes int

	// registered is closed once WORKER_REGISTERED is queued; assignments wait for it,
	// so the worker never sees TASK_ASSIGN before its registration is acknowledged.
	registered chan struct{}
	// released is closed when the session has settled the worker's loss and left the
	// registry; a session superseding this one waits for it.
	released   chan struct{}
	superseded atomic.Bool

	// ctx ends when the session leaves: heartbeats and waiting handlers stop.
	ctx     context.Context
	cancel  context.CancelFunc
	beats   sync.WaitGroup // the heartbeat in flight
	beating atomic.Bool
	// lastBeat is when the worker last sent HEARTBEAT (Unix nanoseconds): only a worker
	// that heartbeats is registered with a new leader on its announcement.
	lastBeat atomic.Int64

	pending inflight // results being delivered; they outlive the connection
	// results delivers them, in batches on task.results when the coordinator takes
	// them (one session each: a batch speaks for one worker id).
	results *workerproto.Results

	// held is what the worker holds as far as the bridge knows: the assignments it
	// forwarded, until their results are delivered or their cancels forwarded. Its
	// heartbeats and registrations report it, so the coordinator finds assignments and
	// cancels lost while the bridge's NATS connection was down (protocol/held.go).
	held *workerproto.Holdings
}

func (b *Bridge) serveWorker(c net.Conn, release func()) {
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	remote := c.RemoteAddr().String()
	s := &workerSession{
		b: b, conn: c,
		reader:     frame.NewReader(c),
		out:        newOutbox(c, b.cfg.WriteQueue, b.cfg.WriteTimeout, b.cfg.FrameStallTimeout),
		log:        b.log.With("port", "worker", "remote", remote),
		registered: make(chan struct{}),
		released:   make(chan struct{}),
		ctx:        ctx, cancel: cancel,
		held: workerproto.NewHoldings(),
	}
	s.log.Debug("worker connected")
	reg := s.awaitRegister()
	if reg == nil {
		s.out.kill("not registered")
		s.out.wait()
		return
	}
	s.log = s.log.With("worker", reg.WorkerID)
	if err := s.join(reg); err != nil {
		s.log.Info("registration refused", "err", err)
		s.out.finish(encodeError(protocol.BadRegistration()))
		s.out.wait()
		return
	}
	if s.register() {
		s.loop()
	}
	s.stop()
	s.out.wait()
	release() // the connection is closed: its slot is free while its results settle
	s.leave()
	s.b.stats.retire(s.node)
}

// awaitRegister reads the first message, which must be a usable WORKER_REGISTER. On
// anything else it queues the ERROR that ends the connection and returns nil.
func (s *workerSession) awaitRegister() *protocol.WorkerRegister {
	payload, err := readFirstFrame(s.conn, s.reader, &s.readDL, s.b.cfg.FrameStallTimeout)
	if err != nil {
		s.b.readFailed(s.log, err, "worker", s.out.finish)
		return nil
	}
	s.regBytes = len(payload)
	msg, err := protocol.Decode(payload)
	if err != nil {
		s.b.stats.malformed("worker")
		s.log.Info("malformed first message; closing", "err", err)
		s.out.finish(encodeError(protocol.MalformedRequest(err)))
		return nil
	}
	reg, ok := msg.(*protocol.WorkerRegister)
	if !ok {
		s.log.Info("first message is not WORKER_REGISTER; closing", "type", msg.MessageType())
		s.out.finish(encodeError(protocol.FirstMessageMustRegister()))
		return nil
	}
	if perr := reg.Validate(); perr != nil {
		s.log.Info("bad registration; closing", "worker", clip(reg.WorkerID), "capacity", reg.Capacity)
		s.out.finish(encodeError(perr))
		return nil
	}
	// A spec worker sends no task-type list and runs the five built-ins; a worker that
	// sends one (the native extension, in any language) serves and declares what it
	// lists, as a native worker does. The coordinator checks it.
	//
	// What a worker holds is the bridge's to report, from what it forwarded: a new
	// connection holds nothing the coordinator could keep (PROTOCOL.md: the attempts
	// of a lost connection end with it). Said as an empty report, so that a
	// coordinator that restarted meanwhile counts the worker's earlier attempts lost
	// at once, rather than waiting for the worker to claim them.
	reg.Held, reg.Instance = &protocol.Held{}, ""
	// The bridge takes the worker's assignments in batches (PathAssigns), whatever its
	// frame said, and writes each as a TASK_ASSIGN frame of its own (relayAssigns).
	reg.Assigns = protocol.MaxAssigns
	return reg
}

// join creates the worker's bus node and claims its id on this bridge. A live session
// of the same id is superseded: it is closed without reporting a loss (the new
// registration supersedes the old one at the coordinator), and join waits until it
// has settled, so its late disconnect can never remove the new registration.
func (s *workerSession) join(reg *protocol.WorkerRegister) error {
	// One handler at a time (fromCoordinator): the coordinator's messages become
	// frames in the order they arrived.
	node, err := bus.New(s.b.nc, bus.Address{Role: bus.RoleWorker, ID: reg.WorkerID},
		bus.WithLogger(s.log), bus.WithAskTimeout(s.b.cfg.RequestTimeout), bus.WithEnvelope(bus.Envelope2),
		bus.WithMaxInFlight(1))
	if err != nil {
		return err
	}
	s.reg, s.node = *reg, node
	// Results are delivered even after the connection closed, until the bridge closes.
	s.results = workerproto.NewResults(s.b.ctx, node, reg.WorkerID, resultRetry, resultAsks, &s.b.wg)
	s.b.stats.track(node)
	if old := s.b.workers.claim(s); old != nil {
		s.log.Info("worker re-registered; superseding the previous connection")
		old.supersede()
		<-old.released
	}
	return nil
}

// supersede ends a session whose worker id a newer connection took over.
func (s *workerSession) supersede() {
	s.superseded.Store(true)
	s.out.kill("superseded by a new registration")
}

// register serves task.assigns, task.assign and task.cancel (fromCoordinator), then
// asks the coordinator to register the worker and queues its answer. Serving first
// means no assignment sent in response to the registration can be missed.
func (s *workerSession) register() bool {
	if s.superseded.Load() {
		return false
	}
	if err := s.node.HandleAny(s.fromCoordinator); err != nil {
		s.log.Warn("cannot serve the worker on the bus", "err", err)
		s.out.finish(encodeError(s.askError(protocol.PathRegister, err)))
		return false
	}
	ans, err := s.registerServed()
	if err != nil {
		s.log.Info("registration failed; closing", "err", err)
		s.out.finish(encodeError(s.askError(protocol.PathRegister, err)))
		return false
	}
	s.held.Marked(ans.Mark)
	s.results.Serves(ans.Results) // 0 from a coordinator without batches: one by one
	// The spec's WORKER_REGISTERED carries the worker id only.
	data, err := protocol.Encode(&protocol.WorkerRegistered{WorkerID: ans.WorkerID})
	if err != nil || !s.out.put(data) {
		return false
	}
	close(s.registered)
	s.log.Debug("worker registered", "capacity", s.reg.Capacity) // the coordinator logs it at info
	return true
}

// registerServed asks the coordinator to register the worker, and asks again while no
// coordinator serves registrations (one is starting, as beside jobbus serve, or failing
// over) until the request timeout: an ask nobody received cannot have been acted on.
// The spec's worker gives up on an ERROR to its registration, so answering at once
// would end a worker started a moment before its coordinator.
func (s *workerSession) registerServed() (*protocol.WorkerRegistered, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.b.cfg.RequestTimeout)
	defer cancel()
	return natsreq.UntilServed(ctx, func(err error) bool { return errors.Is(err, bus.ErrNoPeer) }, func() (*protocol.WorkerRegistered, error) {
		return workerproto.Register(ctx, s.node, &s.reg)
	})
}

// askError is the ERROR a worker gets when an ask on its behalf failed: the
// coordinator's own refusal as it is, that the ask was too large to send, or why no
// coordinator answered.
func (s *workerSession) askError(path string, err error) *protocol.Error {
	var re *bus.RemoteError
	switch {
	case errors.As(err, &re):
		return &protocol.Error{Message: re.Message}
	case errors.Is(err, nats.ErrMaxPayload):
		// Refused by the connection before it was sent (a registration with a
		// declaration too large to wrap): a coordinator may well be up, and sending
		// the same again cannot help.
		return errTooLargeToForward(s.regBytes, s.b.nc.MaxPayload())
	case s.b.ctx.Err() != nil:
		return errShuttingDown()
	case errors.Is(err, bus.ErrNoPeer):
		return errUnavailable("no coordinator is serving " + path)
	case errors.Is(err, bus.ErrTimeout):
		return errUnavailable(fmt.Sprintf("no reply within %v", s.b.cfg.RequestTimeout))
	case errors.Is(err, bus.ErrDisconnected):
		return errUnavailable("the bridge is not connected to NATS")
	}
	return errUnavailable(err.Error())
}

// fromCoordinator serves every path of the worker's own subject on one subscription,
// one message at a time (the node has one handler slot), so that the worker gets the
// frames in the order the coordinator sent them: an attempt's TASK_CANCEL never
// overtakes its TASK_ASSIGN (PROTOCOL.md: "TASK_CANCEL follows a revoked lease"). A
// handler per path would run on a subscription of its own, concurrently with the
// others, in no order.
func (s *workerSession) fromCoordinator(ctx context.Context, req *bus.Request) (any, error) {
	switch req.Path {
	case protocol.PathAssigns:
		return s.relayAssigns(ctx, req)
	case protocol.PathAssign: // a coordinator that does not batch (an older one)
		return s.relay(ctx, protocol.TypeTaskAssign, req)
	case protocol.PathCancel:
		return s.relay(ctx, protocol.TypeTaskCancel, req)
	}
	return nil, bus.Errorf(bus.CodeNotFound, "a TCP worker serves no path %s", req.Path)
}

// relay serves task.assign or task.cancel: the coordinator's message becomes a frame,
// as Encode writes it (relayed), so that only a well-formed message of the expected
// type reaches the worker. It waits while the connection's queue is full (outbox.put);
// a peer that stops reading is dropped, which reports the worker lost.
func (s *workerSession) relay(ctx context.Context, want protocol.Type, req *bus.Request) (any, error) {
	data, ref, err := relayed(want, req.Data)
	if err != nil {
		s.log.Warn("dropping a bad message from the coordinator", "path", req.Path, "err", err)
		return nil, nil
	}
	if want == protocol.TypeTaskAssign {
		// Held from its arrival, before the wait: a heartbeat meanwhile must not
		// report it missing (and the worker may answer it as soon as it is sent).
		s.held.Add(ref)
	}
	if !s.awaitRegistered(ctx) {
		return nil, nil
	}
	if s.out.put(data) && s.log.Enabled(ctx, slog.LevelDebug) { // unguarded, its argument is boxed on every frame
		s.log.Debug("frame queued", "type", want)
	}
	if want == protocol.TypeTaskCancel {
		// The lease is revoked: whether the worker stops or not, nothing it holds
		// under it counts any more.
		s.held.Remove(ref)
	}
	return nil, nil
}

// awaitRegistered waits until the worker has its WORKER_REGISTERED (frames for it go
// after that one), and reports false if the session or the request ends first.
func (s *workerSession) awaitRegistered(ctx context.Context) bool {
	select {
	case <-s.registered:
		return true
	case <-s.ctx.Done():
	case <-ctx.Done():
	}
	return false
}

// relayAssigns is the handler of task.assigns: each assignment of the batch becomes a
// TASK_ASSIGN frame of its own, in the batch's order, byte for byte the frame relay
// writes for one sent alone (relayed), and is held as relay holds it, all of them from
// the batch's arrival. A bad assignment is dropped as relay drops a bad message; the
// others still go.
func (s *workerSession) relayAssigns(ctx context.Context, req *bus.Request) (any, error) {
	assigns, err := protocol.SplitAssigns(req.Data)
	if err != nil {
		s.log.Warn("dropping a bad message from the coordinator", "path", req.Path, "err", err)
		return nil, nil
	}
	frames := make([][]byte, 0, len(assigns))
	for _, a := range assigns {
		data, ref, err := relayed(protocol.TypeTaskAssign, a)
		if err != nil {
			s.log.Warn("dropping a bad message from the coordinator", "path", req.Path, "err", err)
			continue
		}
		s.held.Add(ref) // before the wait, as relay does
		frames = append(frames, data)
	}
	if !s.awaitRegistered(ctx) {
		return nil, nil
	}
	for _, data := range frames {
		if !s.out.put(data) {
			break // the connection is dropped, which reports the worker lost
		}
	}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.Debug("frames queued", "type", protocol.TypeTaskAssign, "n", len(frames))
	}
	return nil, nil
}

// relayed is the frame a message of type want from the coordinator becomes, and the
// attempt it names. A message as Encode writes it (a TASK_ASSIGN as the coordinator
// encodes it) is forwarded as it is: encoding it again would write the same bytes
// (protocol.DecodeExact), at a cost paid once per job.
func relayed(want protocol.Type, data []byte) ([]byte, protocol.AttemptRef, error) {
	msg, exact, err := protocol.DecodeExact(data)
	if err == nil && msg.MessageType() != want {
		err = fmt.Errorf("got %s", msg.MessageType())
	}
	if a, ok := msg.(*protocol.TaskAssign); ok && (a.TraceParent != "" || a.TraceState != "") {
		// The job's trace context is a native extension: a spec worker does not see it.
		a.TraceParent, a.TraceState = "", ""
		exact = false
	}
	if err == nil && !exact {
		data, err = protocol.Encode(msg)
	}
	if err != nil {
		return nil, protocol.AttemptRef{}, err
	}
	return data, heldRef(msg), nil
}

// heldRef names the attempt of a TASK_ASSIGN or TASK_CANCEL.
func heldRef(msg protocol.Message) protocol.AttemptRef {
	switch m := msg.(type) {
	case *protocol.TaskAssign:
		return protocol.AttemptRef{JobID: m.JobID, AttemptID: m.AttemptID}
	case *protocol.TaskCancel:
		return protocol.AttemptRef{JobID: m.JobID, AttemptID: m.AttemptID}
	}
	return protocol.AttemptRef{}
}

// loop reads the registered worker's frames until the connection ends or breaks the
// protocol. Nothing here blocks on the coordinator.
func (s *workerSession) loop() {
	for {
		payload, err := readFrame(s.conn, s.reader, &s.readDL, s.b.cfg.FrameStallTimeout)
		if err != nil {
			s.b.readFailed(s.log, err, "worker", s.out.finish)
			return
		}
		msg, err := protocol.Decode(payload)
		if err != nil {
			s.b.stats.malformed("worker")
			s.log.Info("malformed message; closing", "err", err)
			s.out.finish(encodeError(protocol.MalformedRequest(err)))
			return
		}
		switch m := msg.(type) {
		case *protocol.Heartbeat:
			s.lastBeat.Store(time.Now().UnixNano())
			s.heartbeat()
		case *protocol.TaskResult:
			if !s.result(m, len(payload)) {
				return
			}
		default:
			s.log.Info("unexpected message; closing", "type", m.MessageType())
			s.out.finish(encodeError(protocol.UnexpectedType(m.MessageType(), "worker")))
			return
		}
	}
}

// heartbeat asks the coordinator to refresh the worker, one beat at a time (a beat
// arriving while one is in flight adds nothing). A coordinator that does not know the
// worker (it restarted, or lost the worker) gets the original registration again.
func (s *workerSession) heartbeat() {
	if !s.beating.CompareAndSwap(false, true) {
		return
	}
	s.beats.Add(1)
	go func() {
		defer s.beats.Done()
		defer s.beating.Store(false)
		ctx, cancel := context.WithTimeout(s.ctx, s.b.cfg.RequestTimeout)
		defer cancel()
		switch beat, mark, err := workerproto.Heartbeat(ctx, s.node, &protocol.Heartbeat{WorkerID: s.reg.WorkerID, Held: s.held.Report()}); beat {
		case workerproto.Alive:
			s.held.Marked(mark)
		case workerproto.Forgotten:
			s.log.Info("coordinator does not know the worker; registering again", "err", err)
			rctx, rcancel := context.WithTimeout(s.ctx, s.b.cfg.RequestTimeout)
			defer rcancel()
			// What the worker still runs is reported: the coordinator keeps the leases
			// it still has, and cancels the rest at the next heartbeat.
			reg := s.reg
			reg.Held = s.held.Report()
			s.held.Reset()
			if ans, err := workerproto.Register(rctx, s.node, &reg); err != nil {
				s.log.Warn("registering again failed", "err", err)
			} else {
				s.held.Marked(ans.Mark)
				s.results.Serves(ans.Results)
			}
		case workerproto.Unanswered:
			s.log.Debug("heartbeat not answered", "err", err)
		}
	}()
}

// result starts delivering a TASK_RESULT of size bytes, as this worker whatever
// workerId it carries. While too many results are in delivery it waits, not reading
// the connection; it reports false when the session ends meanwhile.
func (s *workerSession) result(res *protocol.TaskResult, size int) bool {
	if !s.pending.acquire(s.ctx, size, maxPendingResults, maxPendingResultBytes) {
		return false
	}
	res.WorkerID = s.reg.WorkerID
	s.held.Finished(protocol.AttemptRef{JobID: res.JobID, AttemptID: res.AttemptID})
	s.b.deliveries.Go(func() { s.deliver(res, size) })
	return true
}

// deliver offers a result to the coordinator until it answers finally (the answer
// comes once the outcome is durable), for up to ResultRetryFor, and even after the
// connection closed; Close abandons it once its ShutdownTimeout has passed. A stale result is answered too, and changes
// nothing. It goes with the session's other results that are waiting meanwhile, in
// one ask (workerproto.Results), or alone to a coordinator that takes no batches.
func (s *workerSession) deliver(res *protocol.TaskResult, size int) {
	defer s.pending.release(size)
	defer s.held.Remove(protocol.AttemptRef{JobID: res.JobID, AttemptID: res.AttemptID})
	// Each offer waits the node's ask timeout, RequestTimeout.
	ack, tries, err := s.results.DeliverUntil(res, time.Now().Add(s.b.cfg.ResultRetryFor))
	s.b.stats.result(err)
	// The job's attributes are added per line, not with log.With per result: that
	// would cost an allocation for every result to log a debug line.
	if err != nil {
		s.log.Warn("result abandoned", "job", res.JobID, "attempt", res.AttemptID, "err", err, "tries", tries)
		return
	}
	if s.log.Enabled(context.Background(), slog.LevelDebug) { // unguarded, every result's arguments are boxed
		s.log.Debug("result delivered", "job", res.JobID, "attempt", res.AttemptID, "accepted", ack.Accepted, "tries", tries)
	}
}

// stop ends the session's connection and its life as the worker on the bus: it stops
// serving the worker's bus paths and heartbeats. Its results are still delivered.
func (s *workerSession) stop() {
	s.out.kill("session ended")
	s.cancel()
	_ = s.node.UnhandleAny()
	s.beats.Wait()
}

// leave waits until every result the session read is settled and then, unless
// superseded, reports the worker lost. A result read before the connection ended must
// be settled before the loss, or an attempt that completed would be retried; a
// superseding session's registration is a loss too (it holds nothing), and it waits
// for released: so the wait comes first, superseded or not. The wait is as long as the
// results' delivery, not one request: a relay that outlasts RequestTimeout (no
// coordinator serves for a while, during a failover or restart) would otherwise lose
// the attempt it reports. Each delivery ends within ResultRetryFor, or when the bridge's
// Close has waited its ShutdownTimeout.
func (s *workerSession) leave() {
	reason := s.out.dropReason()
	<-s.pending.idle()
	if !s.superseded.Load() && s.b.workers.current(s) {
		s.disconnect()
	}
	s.b.workers.release(s)
	close(s.released)
	s.log.Info("worker connection ended", "dropped", reason, "superseded", s.superseded.Load())
}

// disconnect reports the worker lost.
func (s *workerSession) disconnect() {
	ctx, cancel := context.WithTimeout(context.Background(), s.b.cfg.RequestTimeout)
	defer cancel()
	if err := workerproto.Disconnect(ctx, s.node, s.reg.WorkerID, causeClosed); err != nil {
		s.log.Info("could not report the worker lost; the heartbeat timeout will", "err", err)
	}
}

// clip shortens a peer-chosen string for the log.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:max], len(s))
}

// registry maps worker ids to their live sessions on this bridge.
type registry struct {
	mu   sync.Mutex
	live map[string]*workerSession
}

// claim makes s the session of its worker id and returns the one it replaces.
func (r *registry) claim(s *workerSession) *workerSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.live[s.reg.WorkerID]
	r.live[s.reg.WorkerID] = s
	return old
}

func (r *registry) current(s *workerSession) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live[s.reg.WorkerID] == s
}

// announcedWindow is how recently a worker must have heartbeated to be registered with
// a new leader when it announces itself: the reference heartbeat timeout. A worker
// that went silent is left to register on its own, as it would have been.
const announcedWindow = 6 * time.Second

// heartbeatAll makes every live session whose worker heartbeats heartbeat now.
func (r *registry) heartbeatAll() {
	r.mu.Lock()
	live := make([]*workerSession, 0, len(r.live))
	for _, s := range r.live {
		live = append(live, s)
	}
	r.mu.Unlock()
	for _, s := range live {
		select {
		case <-s.registered:
			if time.Since(time.Unix(0, s.lastBeat.Load())) < announcedWindow {
				s.heartbeat()
			}
		default: // still registering, with whoever leads
		}
	}
}

func (r *registry) release(s *workerSession) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live[s.reg.WorkerID] == s {
		delete(r.live, s.reg.WorkerID)
	}
}

// inflight bounds work in progress by count and bytes, and signals when there is none.
type inflight struct {
	mu    sync.Mutex
	n     int
	bytes int
	empty chan struct{} // closed while n == 0; nil means closed
	freed chan struct{} // closed by the next release; nil until someone waits
}

// acquire counts one more unit of size bytes, waiting while maxN units or maxBytes
// bytes are counted (one unit is always allowed). It reports false if ctx ended first.
func (f *inflight) acquire(ctx context.Context, size, maxN, maxBytes int) bool {
	for {
		f.mu.Lock()
		if f.n == 0 || (f.n < maxN && f.bytes+size <= maxBytes) {
			if f.n == 0 {
				f.empty = make(chan struct{})
			}
			f.n++
			f.bytes += size
			f.mu.Unlock()
			return true
		}
		if f.freed == nil {
			f.freed = make(chan struct{})
		}
		freed := f.freed
		f.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return false
		}
	}
}

func (f *inflight) release(size int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	f.bytes -= size
	if f.freed != nil {
		close(f.freed)
		f.freed = nil
	}
	if f.n == 0 {
		close(f.empty)
	}
}

// idle is closed while nothing is in progress.
func (f *inflight) idle() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.empty == nil {
		f.empty = make(chan struct{})
		close(f.empty)
	}
	return f.empty
}
