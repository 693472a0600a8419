package coordinator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/backoff"
)

// Workflows and batches: groups of jobs submitted in one request and stored all or
// nothing (one atomic write of every record: one JetStream atomic batch, or one step of
// the memory store). A group is described by a control (controls.go) under
// "workflow.<id>" or "batch.<id>": its kind, its step names and edges and how often
// each step was retried; its jobs are ordinary jobs whose records carry the group's id
// and their step name, and wait for one another as any job waits for its parents
// (deps.go). A step's job id is derived from the group's id, its name and its retry
// generation, so the control never lists job ids.
//
// A batch is a group whose callbacks are steps created with it, WAITING for every job
// of the batch: onSuccess an ordinary dependent (it runs once all completed, and is
// cancelled otherwise), onComplete one with AfterAnyEnd whose payload gets the counts
// when it is released. Created with the batch in the same atomic write, a callback
// exists exactly once whatever fails over when; it becomes QUEUED by the same
// durable transition as any dependent, so it fires neither twice nor never.

// groupControl is a group's control value.
type groupControl struct {
	Kind        string           `json:"kind"`
	CreatedAt   int64            `json:"createdAtMillis"`
	Fingerprint string           `json:"fingerprint"`
	Steps       []string         `json:"steps"`
	After       [][]int32        `json:"after"`
	AnyEnd      []int32          `json:"anyEnd,omitempty"`
	Gens        map[string]int32 `json:"gens,omitempty"` // steps run again: how often
}

// group is a workflow or batch in memory: its control, each step's current job id,
// and the final states of steps that ended (so a status does not read them again).
// Guarded by the scheduler's mu.
type group struct {
	id   string
	ctl  groupControl
	rev  uint64   // the control's revision
	ids  []string // each step's current job id
	byID map[string]int32
	// final holds the state of each step known to have ended, by step index.
	final map[int32]protocol.State
	errs  map[int32]string
	// seqs holds the record sequence of each step known to have ended, and expired
	// the steps whose records were read as no longer kept: once none of its jobs is
	// kept any more (retention), the group is forgotten (forgetGone).
	seqs    map[int32]uint64
	expired map[int32]bool
	// creating: its jobs are being written (submit or retry); nothing else may change it.
	creating bool
	// created is closed once creating ends, its jobs stored or given up; again asks
	// for a write whose outcome was unknown to be made again now (settleSteps). Both
	// are made with creating (createSteps).
	created, again chan struct{}
	reported       protocol.State // the end reported to metrics
}

// groupWriteTimeout bounds the writes of a group's submission or retry.
const groupWriteTimeout = 30 * time.Second

func controlKey(kind, id string) string { return kind + "." + id }

// stepJobID derives the job id of step name of group id at generation gen: a UUID
// (version 8, RFC 9562's custom one) from a SHA-256 of the three.
func stepJobID(id, name string, gen int32) string {
	h := sha256.Sum256(fmt.Appendf(nil, "jobbus-step\x00%s\x00%s\x00%d", id, name, gen))
	var u uuid
	copy(u[:], h[:16])
	u[6] = u[6]&0x0f | 0x80
	u[8] = u[8]&0x3f | 0x80
	return u.String()
}

func newGroup(id string, ctl groupControl, rev uint64) *group {
	g := &group{id: id, ctl: ctl, rev: rev, ids: make([]string, len(ctl.Steps)), byID: make(map[string]int32, len(ctl.Steps)),
		final: map[int32]protocol.State{}, errs: map[int32]string{}, seqs: map[int32]uint64{}, expired: map[int32]bool{}}
	for i, name := range ctl.Steps {
		g.ids[i] = stepJobID(id, name, ctl.Gens[name])
		g.byID[g.ids[i]] = int32(i)
	}
	return g
}

// groups holds every group this coordinator knows. Guarded by the scheduler's mu.
type groups struct {
	byID      map[string]*group
	collected time.Time // the last collect (collectGroups)
}

func (gs *groups) get(id string) *group {
	if gs.byID == nil {
		return nil
	}
	return gs.byID[id]
}

func (gs *groups) put(g *group) {
	if gs.byID == nil {
		gs.byID = make(map[string]*group)
	}
	gs.byID[g.id] = g
}

// groupOf is the id of the group of the job whose record is r, if any.
func groupOf(r *protocol.Record) string {
	if r.WorkflowID != "" {
		return r.WorkflowID
	}
	return r.BatchID
}

// stepEnded notes that the step job whose record is r ended: from ended, or read back
// by recoverWaiting (a step that ended before this coordinator led). Called with mu
// held.
func (s *scheduler) stepEnded(r *protocol.Record) {
	g := s.groups.get(groupOf(r))
	if g == nil {
		return
	}
	i, ok := g.byID[r.JobID]
	if !ok {
		return
	}
	g.final[i], g.seqs[i] = r.State, r.Seq
	if r.Error != nil && r.State != protocol.StateCompleted {
		g.errs[i] = *r.Error
	}
	if len(g.final) == len(g.ids) {
		s.groupEnded(g)
	}
}

// groupEnded reports a group whose steps all ended to the metrics, once per end.
func (s *scheduler) groupEnded(g *group) {
	st := g.state()
	if st == g.reported {
		return
	}
	g.reported = st
	if o, ok := s.cfg.Observer.(WorkflowObserver); ok {
		o.WorkflowChanged(g.ctl.Kind, st)
	}
}

// WorkflowObserver, if a Config.Observer implements it, hears of workflows and batches
// starting (state "STARTED") and ending (COMPLETED, FAILED or CANCELLED). Called with
// the coordinator's lock held.
type WorkflowObserver interface {
	WorkflowChanged(kind string, state protocol.State)
}

// state is the group's overall state as far as final says: RUNNING while a step has
// not ended, else FAILED if one failed, CANCELLED if one was cancelled, else COMPLETED.
func (g *group) state() protocol.State {
	failed, cancelled := false, false
	for i := range g.ids {
		st, ok := g.final[int32(i)]
		if !ok {
			return "RUNNING"
		}
		switch st {
		case protocol.StateFailed:
			failed = true
		case protocol.StateCancelled:
			cancelled = true
		}
	}
	switch {
	case failed:
		return protocol.StateFailed
	case cancelled:
		return protocol.StateCancelled
	}
	return protocol.StateCompleted
}

// plan is a validated group submission: its steps in order, their parents by index.
type plan struct {
	id    string
	kind  string
	steps []protocol.WorkflowStep
	after [][]int32
	fp    string
	// max attempts, priority and concurrency key of each step, as the submission path
	// resolves them (the key from the payload, by its task type's pointer)
	maxAttempts []int
	prio        []protocol.Priority
	keys        []string
	// trace is the W3C trace context of the request that made the plan (traceparent,
	// tracestate), which every step it creates joins: a workflow is one trace.
	trace [2]string
}

// planGroup validates a submission: ids, names, payloads, edges, no cycle, bounds.
// Every refusal names the step (or edge) at fault, and nothing exists yet.
func (s *scheduler) planGroup(req *protocol.SubmitWorkflow) (*plan, *protocol.Error) {
	bad := func(format string, a ...any) (*plan, *protocol.Error) {
		return nil, &protocol.Error{Message: "Invalid workflow: " + fmt.Sprintf(format, a...)}
	}
	p := &plan{id: req.WorkflowID, kind: req.Kind}
	if p.kind == "" {
		p.kind = protocol.KindWorkflow
	}
	if p.kind != protocol.KindWorkflow && p.kind != protocol.KindBatch {
		return bad("kind %q must be %q or %q", p.kind, protocol.KindWorkflow, protocol.KindBatch)
	}
	if p.id == "" {
		p.id = newID()
	} else if err := protocol.ValidWorkflowID(p.id); err != nil {
		return bad("%v", err)
	}
	steps := slices.Clone(req.Steps)
	if p.kind == protocol.KindBatch {
		if len(req.Edges) > 0 || len(req.Chain) > 0 {
			return bad("a batch has no edges or chain: its jobs wait for nothing")
		}
		for i := range steps {
			if steps[i].Name == "" {
				steps[i].Name = fmt.Sprintf("job-%d", i+1)
			}
			if len(steps[i].After) > 0 {
				return bad("step %s: a batch's jobs wait for nothing", steps[i].Name)
			}
		}
		all := make([]string, len(steps))
		for i := range steps {
			all[i] = steps[i].Name
		}
		for _, cb := range []struct {
			name   string
			step   *protocol.WorkflowStep
			anyEnd bool
		}{{protocol.StepOnSuccess, req.OnSuccess, false}, {protocol.StepOnComplete, req.OnComplete, true}} {
			if cb.step == nil {
				continue
			}
			st := *cb.step
			st.Name, st.After, st.AfterAnyEnd = cb.name, all, cb.anyEnd
			steps = append(steps, st)
		}
	} else if req.OnSuccess != nil || req.OnComplete != nil {
		return bad("onSuccess and onComplete are a batch's (kind %q)", protocol.KindBatch)
	}
	n := len(steps)
	if n == 0 {
		return bad("no steps")
	}
	if n > protocol.MaxWorkflowSteps+2 || (p.kind == protocol.KindWorkflow && n > protocol.MaxWorkflowSteps) {
		return bad("%d steps; at most %d", n, protocol.MaxWorkflowSteps)
	}
	index := make(map[string]int32, n)
	for i := range steps {
		st := &steps[i]
		if err := protocol.ValidStepName(st.Name); err != nil {
			return bad("step %d: %v", i+1, err)
		}
		if _, dup := index[st.Name]; dup {
			return bad("step %s is named twice", st.Name)
		}
		index[st.Name] = int32(i)
	}
	after := make([][]int32, n)
	link := func(from, to string, what string) *protocol.Error {
		f, ok := index[from]
		if !ok {
			return &protocol.Error{Message: fmt.Sprintf("Invalid workflow: %s names unknown step %q", what, from)}
		}
		t, ok := index[to]
		if !ok {
			return &protocol.Error{Message: fmt.Sprintf("Invalid workflow: %s names unknown step %q", what, to)}
		}
		if f == t {
			return &protocol.Error{Message: fmt.Sprintf("Invalid workflow: step %s waits for itself (a cycle)", to)}
		}
		if !slices.Contains(after[t], f) {
			after[t] = append(after[t], f)
		}
		return nil
	}
	for i := range steps {
		for _, a := range steps[i].After {
			if e := link(a, steps[i].Name, "step "+steps[i].Name+"'s after"); e != nil {
				return nil, e
			}
		}
	}
	for k, e := range req.Edges {
		if e := link(e[0], e[1], fmt.Sprintf("edge %d [%s -> %s]", k+1, e[0], e[1])); e != nil {
			return nil, e
		}
	}
	// Every name of the chain is checked, not only those that make an edge: a chain of
	// one name orders nothing, and is most likely a chain mistyped ("a => b").
	for k, name := range req.Chain {
		if _, ok := index[name]; !ok {
			return bad("chain position %d names unknown step %q", k+1, name)
		}
	}
	for k := 1; k < len(req.Chain); k++ {
		if e := link(req.Chain[k-1], req.Chain[k], fmt.Sprintf("chain position %d", k+1)); e != nil {
			return nil, e
		}
	}
	if cyc := findCycle(after); cyc >= 0 {
		return bad("step %s is on a cycle (a workflow is a DAG)", steps[cyc].Name)
	}
	p.maxAttempts = make([]int, n)
	p.prio = make([]protocol.Priority, n)
	p.keys = make([]string, n)
	for i := range steps {
		st := &steps[i]
		sub := protocol.SubmitJob{TaskType: st.TaskType, Payload: st.Payload, MaxAttempts: st.MaxAttempts, Priority: st.Priority}
		if e := sub.CheckSubmission(); e != nil {
			return nil, &protocol.Error{Message: fmt.Sprintf("Invalid workflow: step %s: %s", st.Name, e.Message)}
		}
		if err := s.route.validatePayload(st.TaskType, st.Payload); err != nil {
			return nil, &protocol.Error{Message: fmt.Sprintf("Invalid workflow: step %s: %s", st.Name, validationError(st.TaskType, err).Message)}
		}
		if e := s.route.queueFields(&sub); e != nil {
			return nil, &protocol.Error{Message: fmt.Sprintf("Invalid workflow: step %s: %s", st.Name, e.Message)}
		}
		p.keys[i] = sub.ConcurrencyKey
		p.maxAttempts[i] = st.MaxAttempts
		if p.maxAttempts[i] <= 0 {
			p.maxAttempts[i] = s.route.defaultMaxAttempts(st.TaskType)
		}
		p.prio[i] = protocol.OrNormal(st.Priority)
	}
	p.steps, p.after = steps, after
	def, _ := json.Marshal(struct {
		Kind  string                  `json:"kind"`
		Steps []protocol.WorkflowStep `json:"steps"`
		After [][]int32               `json:"after"`
	}{p.kind, steps, after})
	canon, err := canonicalJSON(def)
	if err != nil {
		return bad("%v", err)
	}
	h := sha256.Sum256(canon)
	p.fp = hex.EncodeToString(h[:])
	return p, nil
}

// findCycle returns a step on a cycle of the graph (after: each step's parents), or
// behind one, or -1: a step topoOrder cannot place.
func findCycle(after [][]int32) int {
	order := topoOrder(after)
	if len(order) == len(after) {
		return -1
	}
	placed := make([]bool, len(after))
	for _, i := range order {
		placed[i] = true
	}
	for i, ok := range placed {
		if !ok {
			return i
		}
	}
	return -1
}

// submitGroup stores a workflow or batch all or nothing and answers with its jobs.
func (s *scheduler) submitGroup(req *protocol.SubmitWorkflow, from request, reply replyFunc) {
	p, perr := s.planGroup(req)
	if perr != nil {
		reply(perr)
		return
	}
	p.trace = stepTrace(from)
	s.forgetGone(p.id)
	due := from.due
	reply = s.groupReply(reply, due, p.kind, p.kind+" "+p.id)
	ctl := groupControl{Kind: p.kind, CreatedAt: s.now().UnixMilli(), Fingerprint: p.fp, After: p.after}
	for i, st := range p.steps {
		ctl.Steps = append(ctl.Steps, st.Name)
		if st.AfterAnyEnd {
			ctl.AnyEnd = append(ctl.AnyEnd, int32(i))
		}
	}
	value, _ := json.Marshal(ctl)
	// Not the request's due: a large workflow may take longer to store than its
	// submitter waits, and cutting the write short only leaves its outcome unknown.
	// Sent again under the same id, it is answered as the first time (resubmitted).
	ctx, cancel := context.WithTimeout(context.Background(), max(due, groupWriteTimeout))
	defer cancel()
	if ans := s.resubmission(p, due); ans != nil {
		reply(ans)
		return
	}
	g := newGroup(p.id, ctl, 0)
	jobs, refusal := s.createSteps(g, p, nil)
	if refusal != nil {
		reply(refusal)
		return
	}
	if err := s.writeSteps(ctx, g, jobs, value, nil); err != nil {
		if errors.Is(err, errControlChanged) { // stored by an earlier send whose answer was lost
			reply(s.resubmitted(p))
			return
		}
		reply(groupNotStored(p.kind+" "+p.id, err))
		return
	}
	out := &protocol.WorkflowSubmitted{WorkflowID: p.id, Jobs: make(map[string]string, len(jobs))}
	for i, name := range ctl.Steps {
		out.Jobs[name] = g.ids[i]
	}
	s.groupStarted(p.kind)
	reply(settled{out})
}

// groupStarted reports a workflow or batch (kind) stored to the metrics.
func (s *scheduler) groupStarted(kind string) {
	if o, ok := s.cfg.Observer.(WorkflowObserver); ok {
		s.mu.Lock()
		o.WorkflowChanged(kind, "STARTED")
		s.unlock()
	}
}

// groupReply is reply, answered "Outcome unknown" (groupNotStored) once due if
// nothing was by then, as a job's submission is (replies.by): a group's write may
// take longer than its requester waits, and goes on. kind is the group's kind, or
// "retry"; what names the request's group for groupNotStored.
func (s *scheduler) groupReply(reply replyFunc, due time.Duration, kind, what string) replyFunc {
	r := s.replies.saying(reply, due, kind, func(cause string) protocol.Message {
		return groupNotStored(what, unknownOutcome(errors.New(cause)))
	})
	return func(m protocol.Message) { r.send(m) }
}

// groupNotStored is the answer to what (a group's submission, a retry) whose write
// failed with err: "Outcome unknown" when it may be stored later (writeAll), which
// states what is known, as JOB_SUBMITTED does (settled); else an ERROR.
func groupNotStored(what string, err error) protocol.Message {
	if errors.Is(err, ErrOutcomeUnknown) {
		return settled{protocol.OutcomeUnknownGroup(what, strings.TrimPrefix(err.Error(), ErrOutcomeUnknown.Error()+": "))}
	}
	return &protocol.Error{Message: fmt.Sprintf("%s was not stored: %v", what, err)}
}

// errEarlierUnconfirmed is why a group sent again is "Outcome unknown": the write of
// its earlier send is not confirmed yet (settleSteps).
var errEarlierUnconfirmed = unknownOutcome(errors.New("the write of its earlier send is not confirmed yet"))

// resubmission answers a submission under the id of a group this coordinator holds,
// or is nil when it holds none. While the group's jobs are being written, it waits
// for them, at most until due, and has a write whose outcome was unknown made again
// now (settleSteps): the same workflow sent again after "Outcome unknown" is answered
// with its jobs once they are stored, and "Outcome unknown" again until then.
func (s *scheduler) resubmission(p *plan, due time.Duration) protocol.Message {
	s.mu.Lock()
	g := s.groups.get(p.id)
	creating := g != nil && g.creating
	s.unlock()
	switch {
	case g == nil:
		return nil
	case creating && g.ctl.Fingerprint == p.fp:
		select {
		case g.again <- struct{}{}:
		default:
		}
		t := time.NewTimer(due)
		defer t.Stop()
		select {
		case <-g.created:
		case <-t.C:
		}
		s.mu.Lock()
		gone := s.groups.get(p.id) == nil // its write was refused: nothing is stored
		s.unlock()
		if gone {
			return nil
		}
	}
	return s.resubmitted(p)
}

// resubmitted answers a submission whose group id exists: the same answer as the
// first time for the same definition (its jobs exist), "Outcome unknown" while they
// are being written, an error for another definition.
func (s *scheduler) resubmitted(p *plan) protocol.Message {
	s.mu.Lock()
	g := s.groups.get(p.id)
	same := g != nil && g.ctl.Fingerprint == p.fp
	creating := same && g.creating
	var out *protocol.WorkflowSubmitted
	if same && !creating {
		out = &protocol.WorkflowSubmitted{WorkflowID: p.id, Jobs: make(map[string]string, len(g.ids))}
		for i, name := range g.ctl.Steps {
			out.Jobs[name] = g.ids[i]
		}
	}
	s.unlock()
	switch {
	case out != nil:
		return settled{out}
	case creating:
		return groupNotStored(p.kind+" "+p.id, errEarlierUnconfirmed)
	case g != nil:
		return &protocol.Error{Message: fmt.Sprintf("Invalid workflow: %s %s already exists with another definition", p.kind, p.id)}
	}
	return &protocol.Error{Message: fmt.Sprintf("Invalid workflow: %s %s already exists with another definition (or is being created)", p.kind, p.id)}
}

// createSteps makes the jobs of p's steps (all of them, or those in redo for a retry,
// whose records old holds) in memory, WAITING for their parents or QUEUED, and held
// for writeSteps. The group is registered, creating.
func (s *scheduler) createSteps(g *group, p *plan, redo map[int32]bool) ([]*job, protocol.Message) {
	s.mu.Lock()
	defer s.unlock()
	if s.fenced != nil {
		return nil, s.refuse()
	}
	n := len(p.steps)
	if redo != nil {
		n = len(redo)
	}
	if s.active+n > s.cfg.MaxActiveJobs {
		return nil, protocol.AtCapacity(s.active, s.cfg.MaxActiveJobs)
	}
	if e := s.store.health().refusal(); e != nil {
		return nil, e
	}
	if old := s.groups.get(g.id); old != nil && old != g && redo == nil {
		return nil, &protocol.Error{Message: fmt.Sprintf("Invalid workflow: %s %s already exists", g.ctl.Kind, g.id)}
	}
	g.creating = true
	g.created, g.again = make(chan struct{}), make(chan struct{}, 1)
	s.groups.put(g)
	jobs := make([]*job, 0, n)
	made := make(map[int32]*job, n)
	for _, i := range topoOrder(p.after) {
		if redo != nil && !redo[i] {
			continue
		}
		st := &p.steps[i]
		sub := &protocol.SubmitJob{TaskType: st.TaskType, Payload: st.Payload, ConcurrencyKey: p.keys[i]}
		j := s.newJob(g.ids[i], sub, p.maxAttempts[i], p.prio[i], "", "")
		if g.ctl.Kind == protocol.KindBatch {
			j.rec.BatchID = g.id
		} else {
			j.rec.WorkflowID = g.id
		}
		j.rec.Step = st.Name
		j.rec.AfterAnyEnd = st.AfterAnyEnd
		j.setTraceContext(p.trace[0], p.trace[1])
		var active []*job
		for _, pi := range p.after[i] {
			pid := g.ids[pi]
			j.rec.After = append(j.rec.After, pid)
			if pj := made[pi]; pj != nil {
				active = append(active, pj)
			} else if pj := s.jobs[pid]; pj != nil && !pj.rec.State.Terminal() {
				active = append(active, pj)
			}
		}
		s.waitFor(j, active)
		delete(g.final, i)
		delete(g.errs, i)
		j.writing = true // held: writeSteps writes every step at once
		s.wq.writes++
		j.version++
		j.rec.UpdatedAt = j.rec.CreatedAt
		s.ready.countJob(queueOf(j), j.seen, j.rec.State) // before note.changed moves seen on
		s.note.changed(j)
		made[i] = j
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// topoOrder lists the steps parents first; the steps on a cycle, and behind one, are
// left out.
func topoOrder(after [][]int32) []int32 {
	n := len(after)
	children := make([][]int32, n)
	indeg := make([]int32, n)
	for c, ps := range after {
		indeg[c] = int32(len(ps))
		for _, p := range ps {
			children[p] = append(children[p], int32(c))
		}
	}
	order := make([]int32, 0, n)
	for i := range n {
		if indeg[i] == 0 {
			order = append(order, int32(i))
		}
	}
	for k := 0; k < len(order); k++ {
		for _, c := range children[order[k]] {
			if indeg[c]--; indeg[c] == 0 {
				order = append(order, c)
			}
		}
	}
	return order
}

// writeSteps stores g's control (value, a create or a CAS on g.rev) and the records of
// jobs at once (jobStore.writeAll), then lets them run. If they were not stored they
// are forgotten as if never submitted, and g gives way to old (a retry's group
// before it), or goes. If it is not known whether they were, they stay held, and are
// written again until it is (settleSteps).
func (s *scheduler) writeSteps(ctx context.Context, g *group, jobs []*job, value []byte, old *group) error {
	s.mu.Lock()
	ws := make([]pendingWrite, 0, len(jobs))
	var encErr error
	for _, j := range jobs {
		w, err := s.wq.pendingWrite(j)
		if err != nil {
			encErr = err
			break
		}
		ws = append(ws, w)
	}
	ctl := control{key: controlKey(g.ctl.Kind, g.id), value: value, rev: g.rev}
	s.unlock()
	var err error
	var rev uint64
	if encErr != nil {
		err = encErr
	} else {
		rev, err = s.store.writeAll(ctx, ctl, ws)
	}
	switch {
	case err == nil:
		s.stepsStored(g, jobs, rev)
	case errors.Is(err, ErrOutcomeUnknown):
		s.run(func() { s.settleSteps(g, jobs, ctl, ws, old) })
	default:
		s.dropSteps(g, jobs, old, err)
	}
	return err
}

// settleDelay paces the writes again of a group whose outcome is unknown: a quorum
// lost takes a while to come back.
var settleDelay = backoff.Policy{Base: 250 * time.Millisecond, Max: 5 * time.Second}

// settleSteps writes again, until its outcome is known, the batch (ctl and ws) of
// g's jobs, held, whose write's outcome was unknown: in a cluster the stream's leader
// may have proposed it without a quorum, and commits it once a follower is back. So
// a group is handled as an uncertain job create is (outcome.go): a copy that lands,
// or a copy refused while the store holds the earlier one (writeAll), lets the jobs
// run as if the first write had been answered, children after their parents; a copy
// refused because the earlier one is still being committed leaves it unknown. Only
// a refusal for good (another control under its key, nothing of it stored), a fence
// or the coordinator stopping gives the jobs up: a leader after this one reads what
// is stored. A submission sent again meanwhile has it written again at once
// (resubmission).
func (s *scheduler) settleSteps(g *group, jobs []*job, ctl control, ws []pendingWrite, old *group) {
	s.log.Warn("a "+g.ctl.Kind+"'s write has an unknown outcome; writing it again until it is known", "id", g.id, "jobs", len(jobs))
	for attempt := 0; ; attempt++ {
		select {
		case <-s.life.Done():
			s.dropSteps(g, jobs, old, unknownOutcome(errors.New("the coordinator stopped")))
			return
		case <-s.fencedCh:
			s.dropSteps(g, jobs, old, unknownOutcome(s.fencedBy()))
			return
		case <-g.again:
		case <-time.After(settleDelay.Delay(attempt)):
		}
		ctx, cancel := context.WithTimeout(s.life, groupWriteTimeout)
		rev, err := s.store.writeAll(ctx, ctl, ws)
		cancel()
		switch {
		case err == nil:
			s.log.Info("a "+g.ctl.Kind+" whose write's outcome was unknown is stored; its jobs run", "id", g.id)
			s.stepsStored(g, jobs, rev)
			if old == nil { // a submission's, not a retry's
				s.groupStarted(g.ctl.Kind)
			}
			return
		case errors.Is(err, ErrOutcomeUnknown): // still unknown: again
		case errors.Is(err, ErrFenced), errors.Is(err, errControlChanged), permanent(err):
			s.log.Warn("a "+g.ctl.Kind+" whose write's outcome was unknown was not stored", "id", g.id, "err", err)
			s.dropSteps(g, jobs, old, err)
			return
		}
	}
}

// stepsStored lets the jobs of g, just stored with g's control at rev, run.
func (s *scheduler) stepsStored(g *group, jobs []*job, rev uint64) {
	s.mu.Lock()
	defer s.unlock()
	g.creating = false
	close(g.created)
	g.rev = rev
	for _, j := range jobs {
		if j.rec.State == protocol.StateQueued && s.jobs[j.rec.JobID] == j {
			s.ready.push(j)
		}
	}
	s.schedule()
}

// dropSteps forgets the jobs of g, not stored (err), as if never submitted; g gives
// way to old (a retry's group before it), or goes.
func (s *scheduler) dropSteps(g *group, jobs []*job, old *group, err error) {
	for _, j := range jobs {
		s.giveUp(j, err)
	}
	s.mu.Lock()
	g.creating = false
	close(g.created)
	if s.groups.get(g.id) == g {
		delete(s.groups.byID, g.id)
		if old != nil {
			s.groups.put(old)
		}
	}
	s.unlock()
	if errors.Is(err, ErrFenced) {
		s.fence(err)
	}
}

// groupStatus answers GET_WORKFLOW.
func (s *scheduler) groupStatus(id string) protocol.Message {
	s.forgetGone(id)
	s.mu.Lock()
	if s.fenced != nil {
		defer s.unlock()
		return s.refuse()
	}
	g := s.groups.get(id)
	if g == nil {
		s.unlock()
		return &protocol.Error{Message: "Unknown workflow: " + id}
	}
	out := &protocol.WorkflowStatus{WorkflowID: id, Kind: g.ctl.Kind, CreatedAtMillis: g.ctl.CreatedAt, Counts: map[protocol.State]int{}}
	out.Steps = make([]protocol.StepStatus, len(g.ids))
	var unread []int32
	for i, name := range g.ctl.Steps {
		st := protocol.StepStatus{Name: name, JobID: g.ids[i]}
		for _, p := range g.ctl.After[i] {
			st.After = append(st.After, g.ctl.Steps[p])
		}
		if j := s.jobs[g.ids[i]]; j != nil {
			st.State, st.Error = j.rec.State, j.rec.Error
		} else if f, ok := g.final[int32(i)]; ok {
			st.State = f
			if e, ok := g.errs[int32(i)]; ok {
				st.Error = &e
			}
		} else {
			unread = append(unread, int32(i))
		}
		out.Steps[i] = st
	}
	s.unlock()
	if len(unread) > 0 {
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		seqs := make(map[int32]uint64, len(unread))
		for _, i := range unread {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				r, err := s.readKept(g.ids[i])
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					out.Steps[i].State = protocol.StateUnknown
					return
				}
				out.Steps[i].State, out.Steps[i].Error = r.State, r.Error
				seqs[i] = r.Seq
			}()
		}
		wg.Wait()
		s.mu.Lock()
		for _, i := range unread {
			if st := out.Steps[i]; st.State.Terminal() && s.groups.get(id) == g {
				g.final[i], g.seqs[i] = st.State, seqs[i]
				if st.Error != nil && st.State != protocol.StateCompleted {
					g.errs[i] = *st.Error
				}
			}
		}
		s.unlock()
	}
	running := false
	failed, cancelled, unknown := false, false, false
	for _, st := range out.Steps {
		out.Counts[st.State]++
		switch {
		case st.State.Active():
			running = true
		case st.State == protocol.StateFailed:
			failed = true
		case st.State == protocol.StateCancelled:
			cancelled = true
		case st.State != protocol.StateCompleted: // its record expired, or could not be read
			unknown = true
		}
	}
	switch {
	case running:
		out.State = "RUNNING"
	case failed:
		out.State = string(protocol.StateFailed)
	case cancelled:
		out.State = string(protocol.StateCancelled)
	case unknown: // it may have failed: COMPLETED only if every step is known to have
		out.State = string(protocol.StateUnknown)
	default:
		out.State = string(protocol.StateCompleted)
	}
	budget := protocol.MaxMessage - 4096
	size := 0
	for k := range out.Steps {
		b, _ := json.Marshal(&out.Steps[k])
		size += len(b) + 1
		if size > budget {
			out.Steps, out.Truncated = out.Steps[:k], true
			break
		}
	}
	return out
}

// cancelGroup cancels every step of a group not yet ended: waiting steps first, so
// that each says the workflow was cancelled rather than that its parent was.
func (s *scheduler) cancelGroup(id string, due time.Duration, reply replyFunc) {
	s.forgetGone(id)
	s.holdColdSteps(id)
	s.mu.Lock()
	defer s.unlock()
	if s.fenced != nil {
		s.out.reply(reply, s.refuse())
		return
	}
	g := s.groups.get(id)
	if g == nil {
		s.out.reply(reply, &protocol.Error{Message: "Unknown workflow: " + id})
		return
	}
	cause := fmt.Sprintf("%s %s cancelled by client request", g.ctl.Kind, id)
	var todo []*job
	for _, waiting := range []bool{true, false} {
		for _, jid := range g.ids {
			j := s.jobs[jid]
			if j == nil || j.rec.State.Terminal() || (j.rec.State == protocol.StateWaiting) != waiting {
				continue
			}
			s.cancelActive(j, cause)
			todo = append(todo, j)
		}
	}
	// The answer counts the steps cancelled by the workflow's cancel, this call's and
	// earlier ones': a cancel sent again is answered as the first.
	before := 0
	for i, jid := range g.ids {
		if j := s.jobs[jid]; j != nil {
			if j.rec.State == protocol.StateCancelled && j.rec.Error != nil && *j.rec.Error == cause && !slices.Contains(todo, j) {
				before++
			}
		} else if g.final[int32(i)] == protocol.StateCancelled && g.errs[int32(i)] == cause {
			before++
		}
	}
	out := &protocol.WorkflowCancelled{WorkflowID: id, Cancelled: before + len(todo), Kind: g.ctl.Kind}
	if len(todo) == 0 {
		s.out.reply(reply, settled{out})
		return
	}
	kind := g.ctl.Kind
	r := s.replies.saying(reply, due, "cancel", func(cause string) protocol.Message {
		return settled{protocol.OutcomeUnknownGroupCancel(kind, id, cause)}
	})
	left := len(todo)
	var failed error
	for _, j := range todo {
		s.markDirty(j, func(err error) {
			s.mu.Lock()
			left--
			if err != nil && failed == nil {
				failed = err
			}
			done, ferr := left == 0, failed
			s.mu.Unlock()
			if !done {
				return
			}
			switch {
			case errors.Is(ferr, ErrOutcomeUnknown):
				r.send(settled{protocol.OutcomeUnknownGroupCancel(kind, id, ferr.Error())})
			case ferr != nil:
				r.send(&protocol.Error{Message: fmt.Sprintf("cancel of %s %s was not all stored: %v", kind, id, ferr)})
			default:
				r.send(settled{out})
			}
		})
	}
	s.schedule()
}

// holdColdSteps holds whole again the steps of group id that wait out of memory, a
// step SCHEDULED beyond the schedule window (one that snoozed: delayed.go), so that a
// cancel finds them with the others. It reads the steps neither in memory nor known
// to have ended. Called without mu.
func (s *scheduler) holdColdSteps(id string) {
	s.mu.Lock()
	var unread []string
	if g := s.groups.get(id); g != nil && s.fenced == nil {
		for i, jid := range g.ids {
			if _, ended := g.final[int32(i)]; !ended && s.jobs[jid] == nil {
				unread = append(unread, jid)
			}
		}
	}
	s.unlock()
	if len(unread) == 0 {
		return
	}
	recs, _ := s.readRecords(unread) // one not read is not cancelled, as before
	s.mu.Lock()
	defer s.unlock()
	for _, r := range recs {
		s.holdCold(r.Record, r.rev) // only one still SCHEDULED and cold
	}
}

// retryGroup runs again, as new jobs, the steps of an ended group that failed or were
// cancelled (the steps that waited on a failed one were cancelled with it).
func (s *scheduler) retryGroup(id string, from request, reply replyFunc) {
	due := from.due
	s.forgetGone(id)
	s.mu.Lock()
	g := s.groups.get(id)
	kind := protocol.KindWorkflow // of an unknown id: the request's name for it
	if g != nil {
		kind = g.ctl.Kind
	}
	// Answered "Outcome unknown" when due, as the group it is: "retry of batch b".
	reply = s.groupReply(reply, due, "retry", "retry of "+kind+" "+id)
	var perr *protocol.Error
	switch {
	case s.fenced != nil:
		perr = s.refuse()
	case g == nil:
		perr = &protocol.Error{Message: "Unknown workflow: " + id}
	case g.creating:
		perr = &protocol.Error{Message: fmt.Sprintf("%s %s is being created or retried", kind, id)}
	}
	var ids []string
	if perr == nil {
		for _, jid := range g.ids {
			if j := s.jobs[jid]; j != nil && !j.rec.State.Terminal() {
				perr = &protocol.Error{Message: fmt.Sprintf("%s %s still runs (step %s is %s): retry it once it ended", kind, id, j.rec.Step, j.rec.State)}
				break
			}
		}
		ids = slices.Clone(g.ids)
	}
	s.unlock()
	if perr != nil {
		reply(perr)
		return
	}
	// Every step ended: read each one's record for its state and definition.
	recs := make([]protocol.Record, len(ids))
	var rerr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, jid := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.mu.Lock() // memory first: a record may not be written yet
			j := s.jobs[jid]
			if j != nil {
				recs[i] = j.rec
			}
			s.unlock()
			if j != nil {
				return
			}
			r, err := s.readKept(jid)
			if err == nil {
				recs[i] = r
				return
			}
			mu.Lock()
			rerr = fmt.Errorf("step %s (job %s): %v", g.ctl.Steps[i], jid, err)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if rerr != nil {
		reply(&protocol.Error{Message: fmt.Sprintf("retry of %s %s: %v", kind, id, rerr)})
		return
	}
	for _, r := range recs { // a step out of memory, SCHEDULED beyond the window (snoozed)
		if !r.State.Terminal() {
			reply(&protocol.Error{Message: fmt.Sprintf("%s %s still runs (step %s is %s): retry it once it ended", kind, id, r.Step, r.State)})
			return
		}
	}
	redo := map[int32]bool{}
	p := &plan{id: id, kind: g.ctl.Kind, after: g.ctl.After, steps: make([]protocol.WorkflowStep, len(ids)),
		maxAttempts: make([]int, len(ids)), prio: make([]protocol.Priority, len(ids)), keys: make([]string, len(ids)), trace: stepTrace(from)}
	for i, r := range recs {
		if p.trace[0] == "" && r.TraceParent != "" { // the retry joins the workflow's trace, without one of its own
			p.trace = [2]string{r.TraceParent, r.TraceState}
		}
		if r.State == protocol.StateFailed || r.State == protocol.StateCancelled {
			redo[int32(i)] = true
		}
		p.steps[i] = protocol.WorkflowStep{Name: g.ctl.Steps[i], TaskType: r.TaskType, Payload: r.Payload, AfterAnyEnd: r.AfterAnyEnd}
		p.maxAttempts[i], p.prio[i], p.keys[i] = r.MaxAttempts, r.Priority, r.ConcurrencyKey
		if r.Step == protocol.StepOnComplete && r.BatchID != "" {
			p.steps[i].Payload = withoutCounts(r.Payload)
		}
	}
	out := &protocol.WorkflowRetried{WorkflowID: id, Jobs: map[string]string{}, Kind: kind}
	if len(redo) == 0 {
		reply(settled{out})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(due, groupWriteTimeout))
	defer cancel()
	s.mu.Lock()
	ctl := g.ctl
	ctl.Gens = make(map[string]int32, len(g.ctl.Gens)+len(redo))
	for k, v := range g.ctl.Gens {
		ctl.Gens[k] = v
	}
	for i := range redo {
		ctl.Gens[ctl.Steps[i]]++
	}
	rev := g.rev
	s.unlock()
	value, _ := json.Marshal(ctl)
	s.mu.Lock()
	ng := newGroup(id, ctl, rev)
	for i, st := range g.final {
		if !redo[i] {
			ng.final[i], ng.seqs[i] = st, g.seqs[i]
		}
	}
	for i := range g.expired {
		if !redo[i] {
			ng.expired[i] = true
		}
	}
	for i, e := range g.errs {
		if !redo[i] {
			ng.errs[i] = e
		}
	}
	ng.reported = ""
	delete(s.groups.byID, id)
	s.unlock()
	jobs, refusal := s.createSteps(ng, p, redo)
	if refusal != nil {
		s.mu.Lock()
		if s.groups.get(id) == ng || s.groups.get(id) == nil {
			s.groups.put(g)
		}
		s.unlock()
		reply(refusal)
		return
	}
	if err := s.writeSteps(ctx, ng, jobs, value, g); err != nil {
		reply(groupNotStored("retry of "+kind+" "+id, err))
		return
	}
	for _, j := range jobs {
		out.Jobs[j.rec.Step] = j.rec.JobID
	}
	reply(settled{out})
}

// batchCounts is the payload of a batch's on-complete callback as it is released:
// its own, with "batch" set to the batch's id and its jobs' counts by end.
func (s *scheduler) batchCounts(c *job) {
	g := s.groups.get(c.rec.BatchID)
	if g == nil {
		return
	}
	counts := map[string]any{"batchId": g.id}
	total, completed, failed, cancelled := 0, 0, 0, 0
	for i, name := range g.ctl.Steps {
		if name == protocol.StepOnSuccess || name == protocol.StepOnComplete {
			continue
		}
		total++
		st, ok := g.final[int32(i)]
		if j := s.jobs[g.ids[i]]; j != nil {
			st, ok = j.rec.State, true
		}
		if !ok {
			continue
		}
		switch st {
		case protocol.StateCompleted:
			completed++
		case protocol.StateFailed:
			failed++
		case protocol.StateCancelled:
			cancelled++
		}
	}
	counts["total"], counts["completed"], counts["failed"], counts["cancelled"] = total, completed, failed, cancelled
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(c.rec.Payload, &obj); err != nil || obj == nil {
		obj = map[string]json.RawMessage{}
	}
	obj["batch"], _ = json.Marshal(counts)
	c.rec.Payload, _ = json.Marshal(obj)
}

// withoutCounts removes the counts a released on-complete callback was given.
func withoutCounts(payload json.RawMessage) json.RawMessage {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(payload, &obj); err != nil || obj == nil {
		return payload
	}
	delete(obj, "batch")
	out, _ := json.Marshal(obj)
	return out
}

// groupExpired reports whether none of g's jobs is kept any more. Steps end at
// different times, and so expire at different times: the first step's record may be
// gone while a later step's is kept, and the group is known until every one is gone.
// Reads from the first step on, so a group whose first step is kept costs one read.
func (s *scheduler) groupExpired(g *group) bool {
	for _, id := range g.ids {
		if _, err := s.readKept(id); !errors.Is(err, errUnknownJob) {
			return false
		}
	}
	return true
}

// recoverGroups reads every group's control back into memory. A group none of whose
// jobs is kept any more (retention ended) goes, its control too.
func (s *scheduler) recoverGroups(ctx context.Context) error {
	s.mu.Lock()
	active := make(map[string][]*job) // group id -> its active jobs
	for _, j := range s.jobs {
		if id := groupOf(&j.rec); id != "" {
			active[id] = append(active[id], j)
		}
	}
	s.unlock()
	for _, kind := range []string{protocol.KindWorkflow, protocol.KindBatch} {
		cs, err := s.store.controls().list(ctx, kind+".")
		if err != nil {
			return fmt.Errorf("recover %ss: %w", kind, err)
		}
		for _, c := range cs {
			var ctl groupControl
			if err := json.Unmarshal(c.value, &ctl); err != nil {
				s.log.Warn("unreadable group control ignored", "key", c.key, "err", err)
				continue
			}
			id := strings.TrimPrefix(c.key, kind+".")
			g := newGroup(id, ctl, c.rev)
			s.mu.Lock()
			s.groups.put(g)
			for _, j := range active[id] {
				if _, ok := g.byID[j.rec.JobID]; ok {
					continue
				}
				// A job of a step that ran again under a generation the control does not
				// say (written before a later one failed over): the job is the truth.
				for i, name := range ctl.Steps {
					if name == j.rec.Step {
						delete(g.byID, g.ids[i])
						g.ids[i] = j.rec.JobID
						g.byID[j.rec.JobID] = int32(i)
					}
				}
			}
			s.unlock()
			if len(active[id]) > 0 {
				continue
			}
			if s.groupExpired(g) {
				s.mu.Lock()
				delete(s.groups.byID, id)
				s.unlock()
				if err := s.store.controls().remove(ctx, c.key, c.rev); err != nil {
					s.log.Warn("expired group's control not removed", "key", c.key, "err", err)
				}
			}
		}
	}
	return nil
}

// stepsKept reports whether a job of g's steps is kept, as far as this coordinator
// knows without a read: one is active, or ended and is still in the index. unsure
// lists the steps it knows neither kept nor expired (ended before it led, never read
// since). Called with mu held.
func (s *scheduler) stepsKept(g *group) (kept bool, unsure []int32) {
	if g.creating {
		return true, nil
	}
	x := &s.kept.index
	for i, id := range g.ids {
		if g.expired[int32(i)] {
			continue
		}
		seq, ok := g.seqs[int32(i)]
		switch {
		case s.jobs[id] != nil:
			return true, nil
		case !ok:
			unsure = append(unsure, int32(i))
		default:
			if e := x.find(seq); e != nil && x.hasID(e, id) {
				return true, nil
			}
		}
	}
	return false, unsure
}

// forgetGone forgets group id once none of its jobs is kept any more (their retention
// ended), as recoverGroups forgets one at a restart: its control first, so that its
// id is free again (a submission under it makes a new one), then its memory. Steps
// whose end it does not know are read until one is found kept. A control that cannot
// be removed now keeps the group known until the next try. Called without mu.
func (s *scheduler) forgetGone(id string) {
	s.mu.Lock()
	g := s.groups.get(id)
	if g == nil || s.fenced != nil {
		s.unlock()
		return
	}
	kept, unsure := s.stepsKept(g)
	s.unlock()
	if kept {
		return
	}
	for _, i := range unsure {
		r, err := s.readKept(g.ids[i])
		s.mu.Lock()
		still := s.groups.get(id) == g && !g.creating
		switch {
		case !still:
		case errors.Is(err, errUnknownJob):
			g.expired[i] = true
		case err == nil && r.State.Terminal():
			g.final[i], g.seqs[i] = r.State, r.Seq
			if r.Error != nil && r.State != protocol.StateCompleted {
				g.errs[i] = *r.Error
			}
		}
		s.unlock()
		if !still || !errors.Is(err, errUnknownJob) {
			return // kept (or not read): not gone
		}
	}
	s.mu.Lock()
	kept, unsure = s.stepsKept(g)
	gone := s.groups.get(id) == g && s.fenced == nil && !kept && len(unsure) == 0
	key, rev := controlKey(g.ctl.Kind, id), g.rev
	s.unlock()
	if !gone {
		return
	}
	ctx, cancel := context.WithTimeout(s.life, 5*time.Second)
	defer cancel()
	if err := s.store.controls().remove(ctx, key, rev); err != nil {
		s.log.Warn("expired group's control not removed", "key", key, "err", err)
		return
	}
	s.mu.Lock()
	if s.groups.get(id) == g && g.rev == rev {
		delete(s.groups.byID, id)
	}
	s.unlock()
}

// collectGroups forgets the groups none of whose jobs is kept any more, at most once
// per collectEvery, so that a coordinator leading for long holds no group none of
// whose jobs it keeps. Only a group with no step kept as far as memory knows is looked
// at further (forgetGone), so a group costs reads only once its steps expire. Called
// with mu held.
func (s *scheduler) collectGroups(now time.Time) {
	if now.Sub(s.groups.collected) < collectEvery {
		return
	}
	s.groups.collected = now
	for id, g := range s.groups.byID {
		if kept, _ := s.stepsKept(g); !kept {
			s.run(func() { s.forgetGone(id) })
		}
	}
}
