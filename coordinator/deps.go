package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Dependencies: a job submitted after other jobs (its parents, Record.After) waits in
// WAITING until every parent ended. Then it becomes QUEUED if every parent COMPLETED
// (or it was submitted with AfterAnyEnd), else it is CANCELLED with the parent that
// stopped it named. The index below is all the memory a waiting job costs beyond the
// job itself: an entry per active parent listing its waiting children, and a count
// per waiting child of its parents still active. Parents that ended are not kept.
// Recovery rebuilds the index from the records (recoverWaiting).
type dependents struct {
	children map[*job][]*job // active parent -> children WAITING on it
	pending  map[*job]int32  // WAITING child -> its parents still active
	// ends are the jobs that ended and whose children are still to be told, in order;
	// releasing says they are being told (a child cancelled on the way ends too, and
	// is told in the same loop instead of by recursion).
	ends      []*job
	releasing bool
}

func (d *dependents) init() {
	if d.children == nil {
		d.children = make(map[*job][]*job)
		d.pending = make(map[*job]int32)
	}
}

// ended tells j's children that j ended, if j is a parent. Called from markDirty,
// with the scheduler's mu held, for every change: it costs a map lookup only when
// some job waits.
func (s *scheduler) ended(j *job) {
	if !j.rec.State.Terminal() {
		return
	}
	if groupOf(&j.rec) != "" {
		s.stepEnded(&j.rec) // workflow.go
	}
	d := &s.deps
	if len(d.pending) > 0 {
		delete(d.pending, j)
	}
	if len(d.children) == 0 {
		return
	}
	if _, ok := d.children[j]; !ok {
		return
	}
	d.ends = append(d.ends, j)
	if d.releasing {
		return
	}
	d.releasing = true
	for len(d.ends) > 0 {
		p := d.ends[0]
		d.ends[0] = nil
		d.ends = d.ends[1:]
		kids := d.children[p]
		delete(d.children, p)
		for _, c := range kids {
			s.parentEnded(c, p)
		}
	}
	d.ends = nil
	d.releasing = false
}

// parentEnded applies the end of parent p to its waiting child c.
func (s *scheduler) parentEnded(c, p *job) {
	d := &s.deps
	if c.rec.State != protocol.StateWaiting {
		return // cancelled meanwhile, or by another parent
	}
	if p.rec.State != protocol.StateCompleted && !c.rec.AfterAnyEnd {
		delete(d.pending, c)
		s.cancelWaiting(c, parentEndedCause(c, p.rec.JobID, p.rec.Step, p.rec.State))
		return
	}
	d.pending[c]--
	if d.pending[c] > 0 {
		return
	}
	delete(d.pending, c)
	s.release(c)
}

// release makes a waiting job whose parents ended QUEUED; a batch's on-complete
// callback gets the batch's counts in its payload first.
func (s *scheduler) release(c *job) {
	if c.rec.BatchID != "" && c.rec.Step == protocol.StepOnComplete {
		s.batchCounts(c)
	}
	s.becomeQueued(c)
}

// parentEndedCause is the error of a job cancelled because a parent ended badly.
func parentEndedCause(c *job, parentID, parentStep string, st protocol.State) string {
	if parentStep != "" && c.rec.Step != "" {
		return fmt.Sprintf("parent step %s (job %s) ended %s; step %s not run", parentStep, parentID, st, c.rec.Step)
	}
	return fmt.Sprintf("parent job %s ended %s", parentID, st)
}

// cancelWaiting moves a WAITING job to CANCELLED with cause. Called with mu held.
func (s *scheduler) cancelWaiting(c *job, cause string) {
	s.cancelActive(c, cause)
	s.markDirty(c, nil)
}

// waitFor makes j, just created, wait for its active parents; with none, j is QUEUED.
// Called with mu held.
func (s *scheduler) waitFor(j *job, active []*job) {
	if len(active) == 0 {
		return
	}
	d := &s.deps
	d.init()
	j.rec.State = protocol.StateWaiting
	for _, p := range active {
		d.children[p] = append(d.children[p], j)
	}
	d.pending[j] = int32(len(active))
}

// forgetWaiting removes j from the index: it was never stored (dropUnstored), or it
// left WAITING other than by its parents (a cancel). Its entries in its parents'
// lists are skipped when they end. Called with mu held.
func (s *scheduler) forgetWaiting(j *job) {
	if s.deps.pending != nil {
		delete(s.deps.pending, j)
	}
}

// parentNotStored cancels the jobs waiting for j, whose create failed (dropUnstored):
// it never existed, so it will never end for them; left waiting, they would wait until
// a restart, which counts a parent it cannot find as one that completed and expired.
// Called with mu held.
func (s *scheduler) parentNotStored(j *job) {
	d := &s.deps
	kids, ok := d.children[j]
	if !ok {
		return
	}
	delete(d.children, j)
	for _, c := range kids {
		if c.rec.State == protocol.StateWaiting {
			delete(d.pending, c)
			s.cancelWaiting(c, fmt.Sprintf("parent job %s was not stored", j.rec.JobID))
		}
	}
}

// errParentRace: a parent ended between the look outside the lock and the one inside.
var errParentRace = "parent job %s ended while this submission was checked; submit it again"

// finishedParents reads, outside the lock, the state of each parent in after that is
// not active in memory: a parent must exist (active, or finished and kept). The error
// names the parent.
func (s *scheduler) finishedParents(after []string) (map[string]protocol.State, *protocol.Error) {
	if len(after) == 0 {
		return nil, nil
	}
	if len(after) > protocol.MaxWorkflowSteps {
		return nil, protocol.InvalidPayload(fmt.Sprintf("at most %d parent jobs, got %d", protocol.MaxWorkflowSteps, len(after)))
	}
	var missing []string
	s.mu.Lock()
	seen := make(map[string]bool, len(after))
	for _, id := range after {
		if seen[id] {
			s.unlock()
			return nil, protocol.InvalidPayload(fmt.Sprintf("parent job %s named twice", id))
		}
		seen[id] = true
		if p := s.jobs[id]; p == nil || p.rec.State.Terminal() {
			missing = append(missing, id)
		}
	}
	s.unlock()
	if len(missing) == 0 {
		return nil, nil
	}
	out := make(map[string]protocol.State, len(missing))
	var mu sync.Mutex
	var first *protocol.Error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, id := range missing {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			snap, err := s.snapshot(id)
			if err == nil && snap.State == protocol.StateScheduled {
				err = s.holdParent(id) // SCHEDULED beyond the window: held to be waited for
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, errUnknownJob):
				if first == nil {
					first = &protocol.Error{Message: "Unknown parent job: " + id}
				}
			case err != nil:
				if first == nil {
					first = err.(*protocol.Error)
				}
			default:
				out[id] = snap.State
			}
		}()
	}
	wg.Wait()
	return out, first
}

// activeParents is, under mu, the parents in after still active; finished holds the
// states read before of the others. A parent that ended other than COMPLETED refuses
// the submission unless anyEnd.
func (s *scheduler) activeParents(after []string, anyEnd bool, finished map[string]protocol.State) ([]*job, *protocol.Error) {
	var active []*job
	for _, id := range after {
		st, known := finished[id]
		if p := s.jobs[id]; p != nil {
			if !p.rec.State.Terminal() {
				active = append(active, p)
				continue
			}
			st, known = p.rec.State, true
		}
		if !known || st.Active() { // not held, yet not ended as far as was read
			return nil, &protocol.Error{Message: fmt.Sprintf(errParentRace, id)}
		}
		if !st.Active() && st != protocol.StateCompleted && !anyEnd {
			return nil, protocol.ParentEnded(id, st)
		}
	}
	return active, nil
}

// recoverWaiting rebuilds the index of waiting jobs after recovery restored them:
// each WAITING job waits for its parents still active; one whose parents all ended
// (their end and its release were two writes, and the coordinator stopped between)
// is released or cancelled now, as it would have been.
func (s *scheduler) recoverWaiting(ctx context.Context) error {
	s.mu.Lock()
	var waiting []*job
	need := map[string]bool{}
	for _, j := range s.jobs {
		if j.rec.State != protocol.StateWaiting {
			continue
		}
		waiting = append(waiting, j)
		for _, id := range j.rec.After {
			if p := s.jobs[id]; p == nil {
				need[id] = true
			}
		}
	}
	s.unlock()
	if len(waiting) == 0 {
		return nil
	}
	ended := make(map[string]protocol.Record, len(need))
	var mu sync.Mutex
	var failed error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for id := range need {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			r, err := s.readKept(id)
			if err == nil && r.State == protocol.StateScheduled {
				err = s.holdParent(id) // SCHEDULED beyond the window: held to be waited for
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, errUnknownJob):
				// Expired: it had ended before c was admitted, which admits after a
				// COMPLETED parent only (or with AfterAnyEnd). One that ended after c
				// was admitted released or cancelled c as it ended, and a recovery
				// between the two writes reads its record, kept for its retention.
				ended[id] = protocol.Record{JobID: id, State: protocol.StateCompleted}
			case err != nil && failed == nil:
				failed = fmt.Errorf("recover waiting jobs: parent %s: %v", id, err)
			default:
				ended[id] = r
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		return failed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.unlock()
	for _, r := range ended {
		if r.State.Terminal() && groupOf(&r) != "" {
			// A step that ended before: its group knows it, as if seen to end (a
			// batch's on-complete counts it).
			s.stepEnded(&r)
		}
	}
	d := &s.deps
	d.init()
	for _, c := range waiting {
		var active []*job
		var stop *protocol.Record
		for _, id := range c.rec.After {
			if p := s.jobs[id]; p != nil {
				if !p.rec.State.Terminal() {
					active = append(active, p)
					continue
				}
				r := p.rec
				if r.State != protocol.StateCompleted && stop == nil {
					stop = &r
				}
				continue
			}
			if r := ended[id]; r.State != protocol.StateCompleted && stop == nil {
				stop = &r
			}
		}
		switch {
		case stop != nil && !c.rec.AfterAnyEnd:
			s.cancelWaiting(c, parentEndedCause(c, stop.JobID, stop.Step, stop.State))
		case len(active) == 0:
			s.release(c)
		default:
			for _, p := range active {
				d.children[p] = append(d.children[p], c)
			}
			d.pending[c] = int32(len(active))
		}
	}
	return nil
}

// holdParent holds whole again parent id, SCHEDULED beyond the schedule window and so
// kept by its index entry only (delayed.go): the index above knows parents by their
// job in memory, and chillable lets none with children leave it again. A parent no
// longer cold (held meanwhile, or ended) is left as it is. Called without mu.
func (s *scheduler) holdParent(id string) error {
	r, rev, err := s.readRecord(id)
	switch {
	case errors.Is(err, errNoRecord):
		return errUnknownJob
	case err != nil:
		return &protocol.Error{Message: fmt.Sprintf("read job %s: %v", id, err)}
	}
	s.mu.Lock()
	s.holdCold(r, rev)
	s.unlock()
	return nil
}

// parentResults is the outcome of each of j's parents, for its status answer. A
// parent no longer kept (its retention ended before j ran) reads UNKNOWN, as a
// workflow's step does (groupStatus): its end and result are not known any more.
func (s *scheduler) parentResults(after []string) []protocol.ParentResult {
	out := make([]protocol.ParentResult, 0, len(after))
	for _, id := range after {
		snap, err := s.snapshot(id)
		if err != nil {
			out = append(out, protocol.ParentResult{JobID: id, State: protocol.StateUnknown})
			continue
		}
		out = append(out, protocol.ParentResult{JobID: id, Step: snap.Step, State: snap.State, Result: snap.Result})
	}
	return out
}
