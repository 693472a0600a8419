package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Schedules: named, durable, periodic submissions (protocol.Schedule).
//
// A schedule lives as a control (controls.go) under protocol.SchedulePrefix + its
// name, which only the leader writes. Its tick T is submitted through the scheduler's
// normal submit path with the idempotency key protocol.ScheduleTickKey(name, T) and
// Record.Schedule set; only once that job is durable is the schedule's state (the last
// tick done, its job) written. So a coordinator that dies between the two leaves a tick
// whose job its successor finds under the same key instead of submitting another, and
// one that dies before the job is durable leaves a tick its successor submits: exactly
// one job per tick (within the job's retention, which keeps its key bound). A new
// leader reads the controls after recovery and plans each schedule's due ticks by its
// catch-up policy (scheduletime.go); a standby runs no coordinator, and so nothing.

// ScheduleOutcome is what became of a schedule's tick, for a ScheduleObserver.
type ScheduleOutcome string

// Schedule tick outcomes.
const (
	ScheduleSubmitted ScheduleOutcome = "submitted" // its job was stored (or found stored)
	ScheduleFailed    ScheduleOutcome = "failed"    // its submission was refused: the tick is given up, the error shown
	ScheduleRetried   ScheduleOutcome = "retried"   // not stored for now (capacity, store, lease): tried again later
	ScheduleSkipped   ScheduleOutcome = "skipped"   // a due tick the catch-up policy skipped
)

// ScheduleObserver is implemented by an Observer that also counts schedule ticks.
// ScheduleTicked is called without the coordinator's lock; it must be quick.
type ScheduleObserver interface {
	ScheduleTicked(schedule string, outcome ScheduleOutcome, n int)
}

// scheduleIOTimeout bounds one control read or write.
const scheduleIOTimeout = 5 * time.Second

// scheduleRetryMax bounds the wait before a tick not stored for now is tried again.
const scheduleRetryMax = 30 * time.Second

// schedules runs the schedules of a leading coordinator. It owns them (byName, under
// mu) and the goroutines that tick them and serve requests about them (go, under
// goMu: a leaf lock, so that a timer can start one with the scheduler's mu held). Lock
// order: a schedule's op, then mu, then the scheduler's mu.
type schedules struct {
	s   *scheduler
	log *slog.Logger
	obs ScheduleObserver // nil: none

	*goroutines // ticks and requests; ctx ends when the coordinator stops

	mu     sync.Mutex
	byName map[string]*schedEntry
}

// schedEntry is one schedule. op is held across each change of it, I/O included, so
// its changes and ticks happen one at a time; the fields are read and written under
// the schedules' mu as well.
type schedEntry struct {
	op      sync.Mutex
	sc      protocol.Schedule // as stored; NextTickMillis unused
	rev     uint64
	spec    tickSpec
	gen     uint64    // of the timer armed last: an older one's firing is stale
	next    time.Time // armed for; zero while none is
	retries int       // ticks in a row not stored for now
	gone    bool
}

func newSchedules(s *scheduler) *schedules {
	sch := &schedules{s: s, log: s.log, goroutines: newGoroutines(), byName: make(map[string]*schedEntry)}
	sch.obs, _ = s.cfg.Observer.(ScheduleObserver)
	return sch
}

// start reads the schedules from the controls and plans each: the ticks due since
// the last coordinator stopped, by catch-up policy, and a timer for the next.
// Called once recovery is done, before serving.
func (sch *schedules) start(ctx context.Context) error {
	ctls, err := sch.controls().list(ctx, protocol.SchedulePrefix)
	if err != nil {
		return fmt.Errorf("read schedules: %w", err)
	}
	var active []*schedEntry
	sch.mu.Lock()
	for _, c := range ctls {
		var sc protocol.Schedule
		if err := json.Unmarshal(c.value, &sc); err != nil {
			sch.log.Error("schedule unreadable; it is left as it is", "key", c.key, "err", err)
			continue
		}
		spec, err := parseSpec(&sc.ScheduleSpec, sc.CreatedAtMillis)
		if err != nil {
			sch.log.Error("schedule invalid; it is left as it is", "schedule", sc.Name, "err", err)
			continue
		}
		e := &schedEntry{sc: sc, rev: c.rev, spec: spec}
		sch.byName[sc.Name] = e
		if !sc.Paused {
			active = append(active, e)
		}
	}
	sch.mu.Unlock()
	for _, e := range active {
		sch.goRun(func() { sch.tick(e, 0, true) })
	}
	if len(ctls) > 0 {
		sch.log.Info("schedules loaded", "schedules", len(ctls), "active", len(active))
	}
	return nil
}

// controls is where schedules are stored: the job store's controls (controls.go).
func (sch *schedules) controls() controlStore { return sch.s.store.controls() }

// timerCall runs fn under the scheduler's mutex once at comes, while this coordinator
// leads (timers.go). Called with the scheduler's mu held.
func (sch *schedules) timerCall(at time.Time, fn func(time.Time)) { sch.s.timers.call(at, fn) }

// arm sets e's timer for at (none for the zero time), replacing the one armed before.
// Called with e.op held.
func (sch *schedules) arm(e *schedEntry, at time.Time) {
	sch.mu.Lock()
	e.gen++
	gen := e.gen
	e.next = at
	sch.mu.Unlock()
	if at.IsZero() {
		return
	}
	sch.s.mu.Lock()
	sch.timerCall(at, func(time.Time) { sch.goRun(func() { sch.tick(e, gen, false) }) })
	sch.s.unlock()
}

// disarm makes e's armed timer stale. Called with e.op held.
func (sch *schedules) disarm(e *schedEntry) { sch.arm(e, time.Time{}) }

// tick runs e's due ticks: at its timer of generation gen, or, recovering, as the
// coordinator starts (gen 0). Then it arms the next one.
func (sch *schedules) tick(e *schedEntry, gen uint64, recovering bool) {
	e.op.Lock()
	defer e.op.Unlock()
	sch.mu.Lock()
	stale := e.gone || e.sc.Paused || (!recovering && gen != e.gen)
	sc, spec := e.sc, e.spec
	sch.mu.Unlock()
	if stale || sch.ctx.Err() != nil {
		return
	}
	now := sch.s.now()
	p := planTicks(spec, sinceDone(&sc), now, sc.CatchUp, recovering)
	if p.skipped > 0 {
		sch.log.Info("schedule ticks skipped", "schedule", sc.Name, "ticks", p.skipped, "catch_up", orOne(sc.CatchUp))
		sch.observe(sc.Name, ScheduleSkipped, p.skipped)
		if len(p.run) == 0 {
			// Skipped for good: the next coordinator does not count them again.
			next := sc
			next.SinceMillis = now.UnixMilli()
			if err := sch.write(e, next); err != nil {
				sch.log.Warn("schedule's skipped ticks not stored", "schedule", sc.Name, "err", err)
			}
		}
	}
	for _, t := range p.run {
		ok := sch.runTick(e, t)
		sch.mu.Lock()
		if ok {
			e.retries = 0 // the backoff counts failures since the last progress
		} else {
			e.retries++
		}
		delay := min(time.Second<<min(max(e.retries-1, 0), 5), scheduleRetryMax)
		sch.mu.Unlock()
		if !ok {
			sch.arm(e, sch.s.now().Add(delay))
			return
		}
	}
	sch.arm(e, p.next)
}

// sinceDone is when sc's ticks count from: its last tick done, or its creation or
// resume, whichever is later.
func sinceDone(sc *protocol.Schedule) time.Time {
	return time.UnixMilli(max(sc.LastTickMillis, sc.SinceMillis))
}

func orOne(c protocol.CatchUp) protocol.CatchUp {
	if c == "" {
		return protocol.CatchUpOne
	}
	return c
}

func (sch *schedules) observe(name string, o ScheduleOutcome, n int) {
	if sch.obs != nil {
		sch.obs.ScheduleTicked(name, o, n)
	}
}

// runTick submits e's tick at t and records it; false means neither is done for now
// (the submission or the record was not stored), to be tried again. Called with e.op
// held.
func (sch *schedules) runTick(e *schedEntry, t time.Time) bool {
	sch.mu.Lock()
	sc := e.sc
	sch.mu.Unlock()
	id, refused, err := sch.submit(&sc, protocol.ScheduleTickKey(sc.Name, t.UnixMilli()))
	now := sch.s.now().UnixMilli()
	next := sc
	switch {
	case err != nil: // not stored for now: the same tick is tried again, under the same key
		sch.log.Warn("schedule tick not submitted; trying again", "schedule", sc.Name, "tick", t.UnixMilli(), "err", err)
		sch.observe(sc.Name, ScheduleRetried, 1)
		next.LastError, next.LastErrorMillis = err.Error(), now
		next.Failures++
		_ = sch.write(e, next) // only shows the error: the tick is tried again either way
		return false
	case refused != nil:
		sch.log.Warn("schedule tick refused", "schedule", sc.Name, "tick", t.UnixMilli(), "err", refused.Message)
		sch.observe(sc.Name, ScheduleFailed, 1)
		next.LastTickMillis = t.UnixMilli()
		next.LastError, next.LastErrorMillis = refused.Message, now
		next.Failures++
	default:
		sch.log.Debug("schedule tick submitted", "schedule", sc.Name, "tick", t.UnixMilli(), "job", id)
		sch.observe(sc.Name, ScheduleSubmitted, 1)
		next.LastTickMillis = t.UnixMilli()
		next.LastJobID, next.LastRunMillis = id, now
		next.LastError, next.LastErrorMillis, next.Failures = "", 0, 0
	}
	if err := sch.write(e, next); err != nil {
		// The job is stored (or refused); its key finds it when the tick is tried again.
		sch.log.Warn("schedule state not stored; its tick is tried again", "schedule", sc.Name, "tick", t.UnixMilli(), "err", err)
		return false
	}
	return true
}

// submit submits sc's job under key through the scheduler's submit path and waits for
// the answer: the job's id once it is durable (a job already bound to key included),
// the ERROR that refused it for good (refused), or err when it is not stored for now
// (at capacity, the store failing, the lease lapsing, the outcome unknown).
func (sch *schedules) submit(sc *protocol.Schedule, key string) (id string, refused *protocol.Error, err error) {
	req := &protocol.SubmitJob{TaskType: sc.TaskType, Payload: sc.Payload, MaxAttempts: sc.MaxAttempts,
		IdempotencyKey: &key, Priority: sc.Priority}
	answer := make(chan protocol.Message, 1)
	sch.s.submit(req, request{due: sch.s.cfg.ReplyWithin, schedule: sc.Name}, func(m protocol.Message) {
		select {
		case answer <- m:
		default:
		}
	})
	var m protocol.Message
	select {
	case m = <-answer:
	case <-sch.ctx.Done():
		return "", nil, ErrNotServing
	}
	m, _ = unsettle(m)
	switch r := m.(type) {
	case *protocol.JobSubmitted:
		return r.JobID, nil, nil
	case *protocol.SubmitRejected:
		return "", nil, &atCapacity{r}
	case *protocol.Error:
		if strings.HasPrefix(r.Message, ErrNotServing.Error()) || strings.HasPrefix(r.Message, protocol.OutcomeUnknownPrefix) ||
			strings.Contains(r.Message, "was not stored") {
			return "", nil, errors.New(r.Message)
		}
		return "", r, nil
	}
	return "", nil, fmt.Errorf("unexpected answer %s", m.MessageType())
}

// atCapacity is a schedule's submission rejected at capacity: a tick tries it again, a
// trigger answers it as it came (SUBMIT_REJECTED), so that its caller hears a rejection
// worth retrying, as a submission's.
type atCapacity struct{ r *protocol.SubmitRejected }

func (e *atCapacity) Error() string { return e.r.Reason }

// write stores sc as e's schedule, CAS on the revision last read or written. Called
// with e.op held.
func (sch *schedules) write(e *schedEntry, sc protocol.Schedule) error {
	sc.NextTickMillis = 0
	data, err := json.Marshal(sc)
	if err != nil {
		return err
	}
	// Only the leader writes: one whose lease lapsed (paused, cut off) may have a
	// successor that wrote since.
	if !sch.s.lease.held() || sch.s.fencedBy() != nil {
		return fmt.Errorf("store schedule %s: %w", sc.Name, ErrNotServing)
	}
	sch.mu.Lock()
	was, pausing := e.rev, e.sc.Paused != sc.Paused
	sch.mu.Unlock()
	ctx, cancel := context.WithTimeout(sch.ctx, scheduleIOTimeout)
	defer cancel()
	key := protocol.SchedulePrefix + sc.Name
	rev, err := writeControl(ctx, sch.controls(), key, data, was)
	var changed *controlChanged
	if errors.As(err, &changed) && changed.stored != nil && sch.s.lease.held() {
		// Most likely an earlier write of this coordinator that landed unseen (its
		// answer lost, and the read back too; a successor would have taken the lease
		// first): write over it once. A pause or resume answered "Outcome unknown"
		// is such a write: one that is not itself a pause or resume (a tick) keeps it.
		var was protocol.Schedule
		if !pausing && json.Unmarshal(changed.stored.value, &was) == nil {
			sc.Paused, sc.SinceMillis = was.Paused, was.SinceMillis
			data, _ = json.Marshal(sc)
		}
		rev, err = writeControl(ctx, sch.controls(), key, data, changed.stored.rev)
	}
	if errors.Is(err, errControlUnknown) {
		sch.follow(e, sc.Name, was)
	}
	if err != nil {
		return fmt.Errorf("store schedule %s: %w", sc.Name, err)
	}
	sch.mu.Lock()
	e.sc, e.rev = sc, rev
	sch.mu.Unlock()
	return nil
}

// --- The API's half (api.go serves these).

// serve answers a schedule request; reply gets its one answer, later, from a goroutine
// of the schedules.
func (sch *schedules) serve(m protocol.Message, reply replyFunc) {
	started := sch.goRun(func() {
		switch m := m.(type) {
		case *protocol.AddSchedule:
			reply(sch.add(m.Schedule))
		case *protocol.ListSchedules:
			reply(&protocol.ScheduleList{Schedules: sch.list()})
		case *protocol.PauseSchedule:
			reply(sch.change(m.Name, true))
		case *protocol.ResumeSchedule:
			reply(sch.change(m.Name, false))
		case *protocol.RemoveSchedule:
			reply(sch.remove(m.Name))
		case *protocol.TriggerSchedule:
			reply(sch.trigger(m.Name))
		}
	})
	if !started {
		reply(&protocol.Error{Message: ErrNotServing.Error() + ": stopping"})
	}
}

// add creates a schedule, refused when its spec is invalid, a submission of it would
// be refused, or its name is in use.
func (sch *schedules) add(spec protocol.ScheduleSpec) protocol.Message {
	now := sch.s.now().UnixMilli()
	ts, err := parseSpec(&spec, now)
	if err != nil {
		return protocol.InvalidSchedule(strings.TrimPrefix(err.Error(), errInvalidSchedule.Error()+": "))
	}
	spec.CatchUp = orOne(spec.CatchUp)
	if spec.MaxAttempts < 0 {
		return protocol.InvalidSchedule(fmt.Sprintf("maxAttempts must be 0 (the default) or more, got %d", spec.MaxAttempts))
	}
	if e := sch.checkSubmission(&spec); e != nil {
		return e
	}
	e := &schedEntry{spec: ts, sc: protocol.Schedule{ScheduleSpec: spec, CreatedAtMillis: now, SinceMillis: now}}
	e.op.Lock()
	defer e.op.Unlock()
	if !sch.claim(spec.Name, e) {
		return protocol.ScheduleExists(spec.Name)
	}
	data, _ := json.Marshal(e.sc)
	ctx, cancel := context.WithTimeout(sch.ctx, scheduleIOTimeout)
	defer cancel()
	rev, err := writeControl(ctx, sch.controls(), protocol.SchedulePrefix+spec.Name, data, 0)
	if err != nil {
		sch.mu.Lock()
		delete(sch.byName, spec.Name)
		sch.mu.Unlock()
		var changed *controlChanged
		if errors.As(err, &changed) && changed.stored != nil {
			// Most likely this add sent again after an answer "Outcome unknown"
			// whose write landed: memory takes on what is stored.
			return sch.adopt(changed.stored, spec)
		}
		if errors.Is(err, errControlChanged) {
			return protocol.ScheduleExists(spec.Name)
		}
		if errors.Is(err, errControlUnknown) {
			sch.followAdd(spec.Name)
		}
		return scheduleNotStored(spec.Name, "stored", err)
	}
	sch.mu.Lock()
	e.rev = rev
	sch.mu.Unlock()
	next := ts.next(time.UnixMilli(now))
	sch.arm(e, next)
	sch.log.Info("schedule added", "schedule", spec.Name, "next", next)
	return settled{&protocol.ScheduleInfo{Schedule: sch.view(e)}}
}

// claim enters e as schedule name, unless a schedule has that name already; it
// reports whether it did.
func (sch *schedules) claim(name string, e *schedEntry) bool {
	sch.mu.Lock()
	defer sch.mu.Unlock()
	if _, taken := sch.byName[name]; taken {
		return false
	}
	sch.byName[name] = e
	// A read-back of an add (followAdd) ends once the name took an entry, even if it
	// went again since.
	sch.s.follows.changed(protocol.SchedulePrefix + name)
	return true
}

// adopt takes on the schedule stored as c, which an add of spec found there: it is
// added as it is stored, and the add is answered as done if it asked for the same
// schedule, else refused as a name in use.
func (sch *schedules) adopt(c *control, spec protocol.ScheduleSpec) protocol.Message {
	e := sch.takeOn(c)
	if e == nil {
		return protocol.ScheduleExists(spec.Name)
	}
	v := sch.view(e)
	want, _ := json.Marshal(spec)
	have, _ := json.Marshal(v.ScheduleSpec)
	if !bytes.Equal(want, have) {
		return protocol.ScheduleExists(spec.Name)
	}
	return settled{&protocol.ScheduleInfo{Schedule: v}}
}

// takeOn enters the schedule stored as c, armed unless paused, and returns it; nil
// when it cannot be read or its name is taken.
func (sch *schedules) takeOn(c *control) *schedEntry {
	var sc protocol.Schedule
	if err := json.Unmarshal(c.value, &sc); err != nil {
		return nil
	}
	ts, err := parseSpec(&sc.ScheduleSpec, sc.CreatedAtMillis)
	if err != nil {
		return nil
	}
	e := &schedEntry{sc: sc, rev: c.rev, spec: ts}
	e.op.Lock()
	defer e.op.Unlock()
	if !sch.claim(sc.Name, e) {
		return nil
	}
	if !sc.Paused {
		sch.arm(e, ts.next(sinceDone(&sc)))
	}
	sch.log.Info("schedule found stored; taken on", "schedule", sc.Name)
	return e
}

// followAdd has schedule name read back after its add was answered "Outcome unknown",
// and taken on once stored, unless a schedule of that name was added meanwhile
// (scheduler.follow).
func (sch *schedules) followAdd(name string) {
	rb := sch.s.follows.begin(protocol.SchedulePrefix + name)
	holds := func() bool {
		sch.mu.Lock()
		defer sch.mu.Unlock()
		return sch.byName[name] == nil && rb.unchanged()
	}
	sch.s.follow(rb, 0, holds, func(stored *control) bool {
		return stored != nil && sch.takeOn(stored) != nil
	})
}

// follow has schedule e (name) read back after a write of it was answered "Outcome
// unknown" while memory held revision rev, and taken on once the store holds another
// (scheduler.follow).
func (sch *schedules) follow(e *schedEntry, name string, rev uint64) {
	holds := func() bool {
		sch.mu.Lock()
		defer sch.mu.Unlock()
		return !e.gone && e.rev == rev
	}
	sch.s.follow(sch.s.follows.begin(protocol.SchedulePrefix+name), rev, holds, adoptUnder(&e.op, holds, func(stored *control) {
		sch.adoptStored(e, name, stored)
	}))
}

// adoptStored makes e (name) what the store holds (nil: nothing, and e goes), and
// arms it accordingly. Called with e.op held.
func (sch *schedules) adoptStored(e *schedEntry, name string, stored *control) {
	if stored == nil {
		sch.drop(e, name)
		return
	}
	var sc protocol.Schedule
	err := json.Unmarshal(stored.value, &sc)
	var ts tickSpec
	if err == nil {
		ts, err = parseSpec(&sc.ScheduleSpec, sc.CreatedAtMillis)
	}
	if err != nil {
		sch.log.Error("schedule stored unreadable; memory keeps its own", "schedule", name, "err", err)
		return
	}
	sch.mu.Lock()
	e.sc, e.rev, e.spec = sc, stored.rev, ts
	sch.mu.Unlock()
	if sc.Paused {
		sch.disarm(e)
	} else {
		sch.arm(e, ts.next(sinceDone(&sc)))
	}
}

// drop forgets schedule e (name): its timer is disarmed, and it is gone. Called with
// e.op held.
func (sch *schedules) drop(e *schedEntry, name string) {
	sch.disarm(e)
	sch.mu.Lock()
	e.gone = true
	delete(sch.byName, name)
	sch.mu.Unlock()
}

// scheduleNotStored answers a write of schedule name that failed (done: "stored",
// "removed"): not known to have landed (settingUnknown), or not done.
func scheduleNotStored(name, done string, err error) *protocol.Error {
	if errors.Is(err, errControlUnknown) {
		return protocol.OutcomeUnknownSetting("schedule "+name, done, err.Error())
	}
	return &protocol.Error{Message: fmt.Sprintf("schedule %s was not %s: %v", name, done, err)}
}

// checkSubmission refuses a schedule whose submissions would be refused: as a
// submission is checked (lifecycle.go).
func (sch *schedules) checkSubmission(spec *protocol.ScheduleSpec) *protocol.Error {
	req := protocol.SubmitJob{TaskType: spec.TaskType, Payload: spec.Payload}
	if e := req.CheckSubmission(); e != nil {
		return e
	}
	if err := sch.s.route.validatePayload(spec.TaskType, spec.Payload); err != nil {
		return validationError(spec.TaskType, err)
	}
	// A type that takes its concurrency key from the payload refuses a payload that
	// does not resolve its pointer, as the submission of each tick would be.
	return sch.s.route.queueFields(&req)
}

// entry is schedule name's entry, or nil.
func (sch *schedules) entry(name string) *schedEntry {
	sch.mu.Lock()
	defer sch.mu.Unlock()
	return sch.byName[name]
}

// with runs op on schedule name's entry, holding the entry's operation lock, or
// answers Unknown schedule when there is none (or it went while op waited).
func (sch *schedules) with(name string, op func(e *schedEntry) protocol.Message) protocol.Message {
	e := sch.entry(name)
	if e == nil {
		sch.s.catchUp(protocol.SchedulePrefix+name, 0, func(stored *control) {
			if e = sch.takeOn(stored); e == nil {
				e = sch.entry(name) // added meanwhile
			}
		})
	}
	if e == nil {
		return protocol.UnknownSchedule(name)
	}
	e.op.Lock()
	defer e.op.Unlock()
	if e.gone {
		return protocol.UnknownSchedule(name)
	}
	return op(e)
}

// change pauses or resumes schedule name. Resuming counts its ticks from now: those
// that passed while it was paused are not caught up.
func (sch *schedules) change(name string, pause bool) protocol.Message {
	return sch.with(name, func(e *schedEntry) protocol.Message { return sch.changeLocked(e, name, pause) })
}

func (sch *schedules) changeLocked(e *schedEntry, name string, pause bool) protocol.Message {
	sch.mu.Lock()
	next, rev := e.sc, e.rev
	sch.mu.Unlock()
	if next.Paused == pause && sch.s.catchUp(protocol.SchedulePrefix+name, rev, func(stored *control) { sch.adoptStored(e, name, stored) }) {
		sch.mu.Lock()
		next, gone := e.sc, e.gone
		sch.mu.Unlock()
		if gone {
			return protocol.UnknownSchedule(name)
		}
		if next.Paused != pause {
			return sch.changeLocked(e, name, pause)
		}
	}
	if next.Paused == pause {
		// Nothing changes: an active schedule's timer may be a retry's backoff.
		return settled{&protocol.ScheduleInfo{Schedule: sch.view(e)}}
	}
	next.Paused = pause
	if !pause {
		next.SinceMillis = sch.s.now().UnixMilli()
	}
	if err := sch.write(e, next); err != nil {
		return scheduleNotStored(name, "stored", err)
	}
	if pause {
		sch.disarm(e)
	} else {
		sch.mu.Lock()
		sc, spec := e.sc, e.spec
		sch.mu.Unlock()
		sch.arm(e, spec.next(sinceDone(&sc)))
	}
	sch.log.Info("schedule changed", "schedule", name, "paused", pause)
	return settled{&protocol.ScheduleInfo{Schedule: sch.view(e)}}
}

// remove deletes schedule name; its jobs stay.
func (sch *schedules) remove(name string) protocol.Message {
	return sch.with(name, func(e *schedEntry) protocol.Message { return sch.removeLocked(e, name) })
}

func (sch *schedules) removeLocked(e *schedEntry, name string) protocol.Message {
	ctx, cancel := context.WithTimeout(sch.ctx, scheduleIOTimeout)
	defer cancel()
	if _, err := writeControl(ctx, sch.controls(), protocol.SchedulePrefix+name, nil, 0); err != nil {
		if errors.Is(err, errControlUnknown) {
			sch.mu.Lock()
			rev := e.rev
			sch.mu.Unlock()
			sch.follow(e, name, rev) // removed from memory once removed from the store
		}
		return scheduleNotStored(name, "removed", err)
	}
	was := sch.view(e)
	sch.drop(e, name)
	sch.log.Info("schedule removed", "schedule", name)
	return settled{&protocol.ScheduleInfo{Schedule: was}}
}

// trigger submits schedule name's job now, paused or not, under a key of its own; its
// ticks go on as before.
func (sch *schedules) trigger(name string) protocol.Message {
	return sch.with(name, func(e *schedEntry) protocol.Message { return sch.triggerLocked(e, name) })
}

// triggerFailed is the answer to a trigger of schedule name whose submission failed
// with err (submit): "Outcome unknown" when its job may be stored, never "not
// submitted" then.
func triggerFailed(name string, err error) protocol.Message {
	if cause, unknown := strings.CutPrefix(err.Error(), protocol.OutcomeUnknownPrefix); unknown {
		return settled{protocol.OutcomeUnknownTrigger(name, cause)}
	}
	return &protocol.Error{Message: fmt.Sprintf("schedule %s: trigger not submitted: %v", name, err)}
}

func (sch *schedules) triggerLocked(e *schedEntry, name string) protocol.Message {
	sch.mu.Lock()
	sc := e.sc
	sch.mu.Unlock()
	now := sch.s.now()
	id, refused, err := sch.submit(&sc, protocol.ScheduleTriggerKey(name, nuid.Next()))
	next := sc
	var full *atCapacity
	switch {
	case errors.As(err, &full):
		return full.r
	case err != nil:
		return triggerFailed(name, err)
	case refused != nil:
		sch.observe(name, ScheduleFailed, 1)
		next.LastError, next.LastErrorMillis = refused.Message, now.UnixMilli()
		next.Failures++
		_ = sch.write(e, next)
		return refused
	}
	sch.observe(name, ScheduleSubmitted, 1)
	next.LastJobID, next.LastRunMillis = id, now.UnixMilli()
	next.LastError, next.LastErrorMillis, next.Failures = "", 0, 0
	if err := sch.write(e, next); err != nil {
		// The job is stored: say so, with the schedule as it was plus its job.
		sch.log.Warn("schedule state not stored after a trigger", "schedule", name, "job", id, "err", err)
	}
	v := sch.view(e)
	v.LastJobID, v.LastRunMillis = id, now.UnixMilli()
	return settled{&protocol.ScheduleInfo{Schedule: v}}
}

// list returns every schedule by name, each with its next tick.
func (sch *schedules) list() []protocol.Schedule {
	sch.mu.Lock()
	es := make([]*schedEntry, 0, len(sch.byName))
	for _, e := range sch.byName {
		es = append(es, e)
	}
	sch.mu.Unlock()
	out := make([]protocol.Schedule, 0, len(es))
	for _, e := range es {
		out = append(out, sch.view(e))
	}
	slices.SortFunc(out, func(a, b protocol.Schedule) int { return strings.Compare(a.Name, b.Name) })
	if b, _ := json.Marshal(out); len(b) > listBudget {
		// Payloads may be large; the list must fit in one reply. What a list is for
		// (when, state, last run and error) stays.
		for i := range out {
			out[i].Payload = nil
		}
	}
	return out
}

// view is e as listed: with its next tick.
func (sch *schedules) view(e *schedEntry) protocol.Schedule {
	sch.mu.Lock()
	defer sch.mu.Unlock()
	v := e.sc
	switch {
	case v.Paused:
	case e.next.After(sinceDone(&v)): // armed: a tick, or a retry of one
		v.NextTickMillis = e.next.UnixMilli()
	default: // not armed yet, or its tick is being done
		if n := e.spec.next(sinceDone(&v)); !n.IsZero() {
			v.NextTickMillis = n.UnixMilli()
		}
	}
	return v
}

// Schedules lists the coordinator's schedules, as jobbus schedule ls shows them, for
// metrics read at scrape time.
func (c *Coordinator) Schedules() []protocol.Schedule { return c.sched.sch.list() }
