package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/jobbus/jobbus/bus/protocol"
	"slices"
	"sort"
	"time"
)

// The scheduler's answers to the API's queries: a job's snapshot, a page of jobs, the
// task types and the counts for Stats, each read under the scheduler's mu and, for a
// finished job, from the store.

// errUnknownJob: no job of that id is kept.
var errUnknownJob = errors.New("unknown job")

// snapshot is job id's snapshot: from memory while it is active, else from its record in
// KV. The error is errUnknownJob, or a *protocol.Error to answer.
func (s *scheduler) snapshot(id string) (protocol.Job, error) {
	s.mu.Lock()
	var refusal *protocol.Error
	if s.fenced != nil {
		refusal = s.refuse()
	}
	j := s.jobs[id]
	var snap protocol.Job
	if j != nil {
		snap = j.snapshot()
	}
	s.unlock()
	switch {
	case refusal != nil:
		return snap, refusal
	case j != nil:
		return snap, nil
	}
	return s.readSnapshot(id)
}

// readSnapshot reads a finished job's record from KV. A record whose job this
// coordinator no longer keeps (its retention ended; JetStream's own expiry may lag or
// lead by a moment) is unknown, so status, lists and idempotency keys agree.
func (s *scheduler) readSnapshot(id string) (protocol.Job, error) {
	r, err := s.readKept(id)
	if err != nil {
		return protocol.Job{}, err
	}
	return r.Snapshot(), nil
}

// readKept reads the record of a job this coordinator keeps from the store; the error
// is errUnknownJob, or a *protocol.Error to answer.
func (s *scheduler) readKept(id string) (protocol.Record, error) {
	var r protocol.Record
	if !protocol.IsRecordKey(id) {
		return r, errUnknownJob
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	data, err := s.store.read(ctx, id)
	switch {
	case errors.Is(err, errNoRecord):
		return r, errUnknownJob
	case err != nil:
		return r, &protocol.Error{Message: fmt.Sprintf("read job %s: %v", id, err)}
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, &protocol.Error{Message: fmt.Sprintf("read job %s: %v", id, err)}
	}
	s.mu.Lock()
	kept := s.kept.index.find(r.Seq)
	known := kept != nil && s.kept.index.hasID(kept, id)
	s.unlock()
	if !known {
		return r, errUnknownJob
	}
	return r, nil
}

// pick takes, newest first, up to limit jobs below sequence from in state (any if ""),
// stopping early once even a lower bound of their size exceeds the list budget. more
// reports that matching jobs were left.
func (s *scheduler) pick(from uint64, state protocol.State, limit int) (picked []listed, more bool, refusal protocol.Message) {
	s.mu.Lock()
	defer s.unlock()
	if s.fenced != nil {
		return nil, false, s.refuse()
	}
	least := 0
	for i := s.kept.index.below(from) - 1; i >= 0; i-- {
		e := &s.kept.index.entries[i]
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
			id := s.kept.index.id(e)
			p.id, p.snap = id, protocol.Job{JobID: id, State: st}
		}
		least += minSnapshotSize(&p.snap)
		picked = append(picked, p)
	}
	return picked, false, nil
}

// taskTypeList is the catalogue as it stands: each type with its live workers and its
// queued and running jobs; the built-ins first, then by name.
func (s *scheduler) taskTypeList() *protocol.TaskTypeList {
	recs := s.cat.records()
	s.mu.Lock()
	infos := make(map[string]*protocol.TaskTypeInfo, len(recs)+5)
	info := func(name string) *protocol.TaskTypeInfo {
		if i := infos[name]; i != nil {
			return i
		}
		i := &protocol.TaskTypeInfo{Name: name, Workers: []string{}}
		infos[name] = i
		return i
	}
	for _, name := range s.cfg.TaskTypes.Names() {
		info(name).Builtin = true
	}
	for name, r := range recs {
		i := info(name)
		i.Schema, i.Options, i.LastServedMillis = r.Schema, r.Options, r.LastServedMillis
	}
	for _, w := range s.reg.workers {
		for t := range w.taskTypes {
			i := info(t)
			i.Workers = append(i.Workers, w.id)
		}
	}
	for _, j := range s.jobs {
		switch j.rec.State {
		case protocol.StateQueued:
			info(j.rec.TaskType).Queued++
		case protocol.StateRunning:
			info(j.rec.TaskType).Running++
		}
	}
	s.unlock()
	out := make([]protocol.TaskTypeInfo, 0, len(infos))
	for _, i := range infos {
		sort.Strings(i.Workers)
		out = append(out, *i)
	}
	slices.SortFunc(out, func(a, b protocol.TaskTypeInfo) int {
		if a.Builtin != b.Builtin {
			if a.Builtin {
				return -1
			}
			return 1
		}
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return &protocol.TaskTypeList{TaskTypes: out}
}

// jobCounts counts the jobs in memory by state.
func (s *scheduler) jobCounts() map[protocol.State]int {
	s.mu.Lock()
	defer s.unlock()
	return countJobs(&s.kept.index, s.jobs)
}

// countJobs counts the jobs by state: the finished ones known by their entries alone
// from the index's counts, the others (every entry with a job: jobs) one by one. A walk
// of every entry held the scheduler's lock for milliseconds at a million kept jobs, on
// every scrape.
func countJobs(x *jobIndex, jobs map[string]*job) map[protocol.State]int {
	n := make(map[protocol.State]int, 6)
	for code, c := range x.done {
		if c != 0 {
			n[codeState[code]] += c
		}
	}
	for _, j := range jobs {
		n[j.rec.State]++
	}
	return n
}
