// Package attempts keeps the attempts a jobbus worker is executing, whatever its
// transport: it starts each assigned attempt on a goroutine of its own, runs its task
// through a tasks.Registry (a panic becomes the attempt's failure), cancels an attempt
// only when both its job and attempt id match, and waits for them all.
//
// Both workers, the native one and the spec TCP one, own one Set; what they do with an
// outcome (deliver it over the bus, write a frame, or drop it) stays theirs.
package attempts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/reuse"
	"github.com/jobbus/jobbus/worker/tasks"
)

// ErrCancelled is the cause of an attempt the coordinator cancelled; its text becomes
// the error of the attempt's result.
var ErrCancelled = errors.New("attempt cancelled by the coordinator")

// Lease identifies an attempt: the coordinator counts only the result of a job's
// current attempt id.
type Lease struct {
	JobID, AttemptID string
}

// Outcome is how an attempt's task ended: its result text, or the error that failed it.
// Err is the attempt's cancellation cause when the task failed after its context ended.
type Outcome struct {
	Result string
	Err    error
	failed failure // Err as its result takes it, when Err is the task's
}

// TaskFailed reports whether Err is the task's own error. That was read once, under
// the task's recover while the attempt ran (Text and Permanent say what it said then),
// and is not to be read again: an error may panic when read once its attempt ended.
func (o Outcome) TaskFailed() bool { return o.failed.read }

// Text is the failure's text, "" on success: the task's error's as read while the
// attempt ran, or Err's when Err is the attempt's own (a cancellation's cause, a
// panic's).
func (o Outcome) Text() string {
	switch {
	case o.failed.read:
		return o.failed.text
	case o.Err != nil:
		return o.Err.Error()
	}
	return ""
}

// Permanent reports whether the failure is permanent (tasks.ErrPermanent), as Text
// reads it.
func (o Outcome) Permanent() bool {
	if o.failed.read {
		return o.failed.permanent
	}
	return o.Err != nil && errors.Is(o.Err, tasks.ErrPermanent)
}

// StoppedBy reports whether the attempt was stopped with cause target (its context's
// cause, errors.Is): never so when Err is the task's own, which is not read again.
func (o Outcome) StoppedBy(target error) bool {
	return o.Err != nil && !o.failed.read && errors.Is(o.Err, target)
}

// failure is what an attempt's result takes of the task's error (ResultBuf.Set), read
// once under runTask's recover while the attempt runs.
type failure struct {
	read      bool
	text      string
	permanent bool
	snoozed   bool
	snooze    time.Duration
}

// readFailure reads err for an attempt's result.
func readFailure(err error) failure {
	f := failure{read: true, text: err.Error(), permanent: errors.Is(err, tasks.ErrPermanent)}
	f.snooze, f.snoozed = tasks.SnoozeOf(err)
	return f
}

// attempt is an attempt executing now. It holds what its goroutine runs too (a
// reuse.Task), so that starting one allocates no closure.
type attempt struct {
	lease  Lease
	gen    uint64 // the generation it was started in
	cancel context.CancelCauseFunc

	set  *Set
	ctx  context.Context
	m    *protocol.TaskAssign
	done Finisher
}

// Run executes the attempt, on one of the Set's goroutines.
func (a *attempt) Run() { a.set.execute(a) }

// Finisher receives an attempt's outcome: a value that holds its attempt's state (the
// native worker's run, the TCP worker's assigned), so that starting one allocates no
// closure.
type Finisher interface{ Finish(Outcome) }

// Slot is room for the Set's record of one attempt. A Finisher made per attempt may
// hold one and give it to Start (SlotHolder), which then allocates no record of its
// own; the Set owns it from Start until the Finisher's Finish returns.
type Slot struct{ a attempt }

// SlotHolder is a Finisher that holds its attempt's Slot.
type SlotHolder interface {
	Finisher
	AttemptSlot() *Slot
}

// Set is the attempts of one worker executing now. Its methods are safe for
// concurrent use.
type Set struct {
	registry *tasks.Registry
	capacity int
	log      *slog.Logger

	// mu guards running, gen and closed: the attempts by lease, the generation new
	// ones belong to, and whether new ones are refused; and revoked.
	mu      sync.Mutex
	running map[Lease]*attempt
	gen     uint64
	closed  bool
	// revoked are the newest leases cancelled while not running, oldest first: a
	// cancel may overtake its assignment on the way (the coordinator sends them in
	// order, but a worker's messages need not be handled in order), and a lease once
	// cancelled never runs. Bounded: a cancel that finds its attempt already ended
	// leaves one here too.
	revoked []Lease

	// wg counts the attempts; Add happens only under mu while not closed, so Wait
	// after Shutdown cannot race with it.
	wg sync.WaitGroup
	// goroutines runs the attempts on reused goroutines (a fresh one's stack grew,
	// by copying, as an attempt's JSON deepened it: 3.7% of a native bench's CPU);
	// pool counts them, and quit, closed by Shutdown, ends the idle ones.
	goroutines *reuse.Pool
	pool       sync.WaitGroup
	quit       chan struct{}
}

// New returns an empty Set that runs tasks from registry. capacity is what the worker
// announced: the coordinator counts free slots itself, so an attempt beyond it still
// runs, with a warning on log.
func New(registry *tasks.Registry, capacity int, log *slog.Logger) *Set {
	s := &Set{registry: registry, capacity: capacity, log: log, running: make(map[Lease]*attempt),
		quit: make(chan struct{})}
	s.goroutines = reuse.New(s.quit, &s.pool)
	return s
}

// Start runs the attempt m in a goroutine of its own, under a context derived from
// parent, then hands its outcome to done once the attempt no longer counts as
// running. It returns false, starting nothing, when the attempt is already running
// (a duplicate assignment), its lease was cancelled before it came, or the Set has
// been shut down.
func (s *Set) Start(parent context.Context, m *protocol.TaskAssign, done Finisher) bool {
	l := Lease{m.JobID, m.AttemptID}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		s.log.Debug("assignment ignored: worker stopping", "job", m.JobID, "attempt", m.AttemptID)
		return false
	case s.running[l] != nil:
		s.log.Debug("duplicate assignment ignored", "job", m.JobID, "attempt", m.AttemptID)
		return false
	case slices.Contains(s.revoked, l):
		s.log.Debug("assignment ignored: its cancel came first", "job", m.JobID, "attempt", m.AttemptID)
		return false
	case len(s.running) >= s.capacity:
		s.log.Warn("assignment beyond capacity", "job", m.JobID, "attempt", m.AttemptID,
			"running", len(s.running), "capacity", s.capacity)
	}
	ctx, cancel := context.WithCancelCause(parent)
	var a *attempt
	if h, ok := done.(SlotHolder); ok {
		a = &h.AttemptSlot().a
	} else {
		a = new(attempt)
	}
	*a = attempt{lease: l, gen: s.gen, cancel: cancel, set: s, ctx: ctx, m: m, done: done}
	s.running[l] = a
	s.wg.Add(1)
	s.goroutines.Run(a)
	return true
}

// execute runs an attempt, forgets it, and hands its outcome to done.
func (s *Set) execute(a *attempt) {
	defer s.wg.Done()
	ctx, m := a.ctx, a.m
	// Guarded: the arguments of every attempt's line would be boxed even with debug off.
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.Debug("attempt started", "job", m.JobID, "attempt", m.AttemptID, "task", m.TaskType, "number", m.AttemptNumber)
	}
	returned := false
	defer func() {
		if returned {
			return
		}
		// The task ended its goroutine without returning (runtime.Goexit, as testing's
		// FailNow does): the attempt fails as a panic's does, or it would count as
		// running, and be reported held, for ever.
		s.log.Error("task ended its goroutine without returning", "job", m.JobID, "attempt", m.AttemptID, "task", m.TaskType)
		s.finish(a)
		a.done.Finish(Outcome{Err: fmt.Errorf("task %s ended its goroutine without returning (runtime.Goexit)", m.TaskType)})
	}()
	out, failed, err := s.runTask(ctx, m)
	returned = true
	if err != nil && ctx.Err() != nil {
		err, failed = context.Cause(ctx), failure{}
	}
	s.finish(a)
	a.done.Finish(Outcome{Result: out, Err: err, failed: failed})
}

// runTask runs the task, turning a panic into the attempt's failure: the task's own,
// or one its error makes when read (a nil *T returned as an error, whose Error method
// uses its receiver). The error is read for the result here, once (failed), while the
// attempt runs: read again as the result is written, outside any recover and after
// the attempt's context ended, an error whose reading panics then would end the
// worker process with every attempt it runs.
func (s *Set) runTask(ctx context.Context, m *protocol.TaskAssign) (out string, failed failure, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("task panicked", "job", m.JobID, "attempt", m.AttemptID, "task", m.TaskType,
				"panic", r, "stack", string(debug.Stack()))
			out, failed, err = "", failure{}, fmt.Errorf("task %s panicked: %v", m.TaskType, r)
		}
	}()
	out, err = s.registry.Run(ctx, m.TaskType, m.AttemptNumber, m.Payload)
	if err != nil {
		failed = readFailure(err)
	}
	return out, failed, err
}

// finish forgets an attempt that has returned and releases its context.
func (s *Set) finish(a *attempt) {
	s.mu.Lock()
	if s.running[a.lease] == a {
		delete(s.running, a.lease)
	}
	s.mu.Unlock()
	a.cancel(context.Canceled)
}

// Cancel cancels the attempt with ErrCancelled, only if it is the one running under
// that lease: a cancel of a superseded attempt must not touch a newer attempt of the
// same job. A cancel of a lease not running is kept (revoked), so that the attempt, if
// its assignment comes after all, never starts. It reports whether an attempt was
// cancelled.
func (s *Set) Cancel(jobID, attemptID string) bool {
	l := Lease{jobID, attemptID}
	s.mu.Lock()
	a := s.running[l]
	if a == nil && !slices.Contains(s.revoked, l) {
		if len(s.revoked) == maxRevoked {
			s.revoked = append(s.revoked[:0], s.revoked[1:]...)
		}
		s.revoked = append(s.revoked, l)
	}
	s.mu.Unlock()
	if a == nil {
		s.log.Debug("cancel ignored: attempt not running", "job", jobID, "attempt", attemptID)
		return false
	}
	a.cancel(ErrCancelled)
	s.log.Debug("attempt cancelled", "job", jobID, "attempt", attemptID)
	return true
}

// maxRevoked bounds Set.revoked: a cancel overtakes its assignment by a moment, so
// the newest few leases suffice.
const maxRevoked = 64

// NextGeneration starts a new generation and returns its number: attempts started from
// now on belong to it, until the next one. Generations start at 0.
func (s *Set) NextGeneration() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	return s.gen
}

// CancelBefore cancels, with cause, the attempts started before generation gen,
// returning how many.
func (s *Set) CancelBefore(gen uint64, cause error) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range s.running {
		if a.gen < gen {
			a.cancel(cause)
			n++
		}
	}
	return n
}

// Shutdown refuses new attempts from now on and cancels the running ones with cause,
// returning how many were running. It may be called more than once.
func (s *Set) Shutdown(cause error) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		close(s.quit)
	}
	s.closed = true
	for _, a := range s.running {
		a.cancel(cause)
	}
	return len(s.running)
}

// Len is the number of attempts running now.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.running)
}

// Wait returns once every attempt started has ended and its done has returned, and
// after Shutdown once their goroutines have ended too. A caller that may still Start
// concurrently must not Wait: Shutdown first, or call both from the same goroutine.
func (s *Set) Wait() {
	s.wg.Wait()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		s.pool.Wait()
	}
}

// Result is the TaskResult of an attempt's outcome, echoing its lease.
func Result(workerID string, m *protocol.TaskAssign, o Outcome) *protocol.TaskResult {
	return new(ResultBuf).Set(workerID, m, o)
}

// ResultBuf holds a TaskResult and its result or error text: a caller that keeps one
// in a value it allocates per attempt anyway (the native worker's) makes a result
// without an allocation of its own; Result makes one.
type ResultBuf struct {
	res  protocol.TaskResult
	text string
}

// Set makes b the TaskResult of an attempt's outcome, echoing its lease, and returns
// it (b's own).
func (b *ResultBuf) Set(workerID string, m *protocol.TaskAssign, o Outcome) *protocol.TaskResult {
	b.res = protocol.TaskResult{WorkerID: workerID, JobID: m.JobID, AttemptID: m.AttemptID, Success: o.Err == nil}
	res := &b.res
	if o.Err == nil {
		b.text = o.Result
		res.Result = &b.text
	} else {
		f := o.failed
		if !f.read {
			f = readFailure(o.Err) // the Set's own error: a cancellation's cause, a panic's
		}
		b.text = f.text
		res.Error = &b.text
		res.Permanent = f.permanent
		if f.snoozed {
			res.SnoozeMillis = max(f.snooze.Milliseconds(), 1)
		}
	}
	return res
}

// Keep moves the running attempts with the given leases into generation gen, so that
// a CancelBefore(gen) spares them: a new registration kept their leases. It returns
// how many it moved.
func (s *Set) Keep(gen uint64, leases []Lease) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range leases {
		if a := s.running[l]; a != nil && a.gen < gen {
			a.gen = gen
			n++
		}
	}
	return n
}
