package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// flow holds starts back where a limit says so (rate limits by task type or queue,
// limits.go): dispatch asks it before it starts a job and tells it once it did. A job
// held back stays QUEUED; flow names when to look again, and dispatch arms a timer for
// then. The limits' settings are durable controls (limit.<scope>.<name>), written here
// and read back by the coordinator that recovers. Its memory is guarded by the
// scheduler's mu; writeMu orders the writes of settings, which happen outside it.
type flow struct {
	s       *scheduler
	limits  *limiter
	writeMu sync.Mutex // one setting written at a time: each a CAS on the revision memory holds
}

// init readies f for s, as newScheduler builds it.
func (f *flow) init(s *scheduler) {
	f.s, f.limits = s, newLimiter()
	f.limits.changed = s.follows.changed
}

// admits: may a job of this queue and type start now? If not, when to look again.
// Called by dispatch with s.mu held.
func (f *flow) admits(queue, taskType string, now time.Time) (ok bool, next time.Time) {
	return f.limits.admits(queue, taskType, now)
}

// started: a job of this queue and type started now (it takes a token). Called by
// dispatch with s.mu held.
func (f *flow) started(queue, taskType string, now time.Time) {
	f.limits.started(queue, taskType, now)
}

// unstarted: a job of this queue and type assigned at once never started (its
// assignment never reached its worker, or its create failed): it gives its token back.
// Called with s.mu held.
func (f *flow) unstarted(queue, taskType string) {
	f.limits.unstarted(queue, taskType, f.s.now())
}

// serve answers a request of the limit API (protocol.SetLimit, RemoveLimit, ListLimits).
// A write goes on off the API's goroutine: it waits for the store.
func (f *flow) serve(m protocol.Message, reply func(protocol.Message)) {
	switch m := m.(type) {
	case *protocol.ListLimits:
		reply(f.listLimits())
	case *protocol.SetLimit:
		f.s.run(func() { reply(f.setLimit(context.Background(), m)) })
	case *protocol.RemoveLimit:
		f.s.run(func() { reply(f.removeLimit(context.Background(), m)) })
	}
}

// recoverLimits reads the limits' settings, before serving: each bucket starts empty
// (limiter's doc comment says why). A setting that cannot be read is skipped, loudly.
func (f *flow) recoverLimits(ctx context.Context) error {
	cs, err := f.s.store.controls().list(ctx, protocol.LimitControlPrefix)
	if err != nil {
		return fmt.Errorf("read rate limits: %w", err)
	}
	s := f.s
	s.mu.Lock()
	defer s.unlock()
	now := s.now()
	for _, c := range cs {
		scope, name, ok := strings.Cut(strings.TrimPrefix(c.key, protocol.LimitControlPrefix), ".")
		var spec protocol.LimitSpec
		var r protocol.Rate
		if ok {
			err = json.Unmarshal(c.value, &spec)
		}
		if ok && err == nil {
			r, err = protocol.ParseRate(spec.Rate)
		}
		if !ok || err != nil || protocol.CheckLimitTarget(scope, name) != nil || spec.Burst < 1 || spec.Burst > protocol.MaxLimitBurst {
			s.log.Error("rate limit setting unreadable; not enforced", "key", c.key, "value", string(c.value), "err", err)
			continue
		}
		f.limits.set(scope, name, r, spec.Burst, c.rev, false, now)
	}
	return nil
}

// setLimit creates or changes a rate limit: durable first, then in force.
func (f *flow) setLimit(ctx context.Context, req *protocol.SetLimit) protocol.Message {
	r, burst, err := req.Check()
	if err != nil {
		return protocol.BadLimit(err)
	}
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	held, rev, refused := f.current(req.Scope, req.Name)
	if refused != nil {
		return refused
	}
	if req.KeepBurst && req.Burst == 0 && held != nil {
		// Read under writeMu, which every change of a limit holds: the burst stored
		// when this write lands, not one a client read before another changed it.
		burst = held.burst
	}
	s := f.s
	value, _ := json.Marshal(protocol.LimitSpec{Rate: r.String(), Burst: burst})
	key := protocol.LimitControlKey(req.Scope, req.Name)
	if rev, err = f.write(ctx, key, value, rev); err != nil {
		return controlFailed("limit of "+req.Scope+" "+req.Name, err)
	}
	s.mu.Lock()
	defer s.unlock()
	now := s.now()
	lim := f.limits.set(req.Scope, req.Name, r, burst, rev, true, now)
	info := lim.info(now)
	s.log.Info("rate limit set", "scope", req.Scope, "name", req.Name, "rate", info.Rate, "burst", burst)
	s.schedule() // a higher rate may let waiting jobs start
	return settled{&protocol.LimitList{Limits: []protocol.LimitInfo{info}}}
}

// current returns the limit on scope and name (nil: none) and the revision of its
// setting, or the refusal of a fenced coordinator. Its callers hold writeMu, so that no
// other change of a limit lands between this read and their write.
func (f *flow) current(scope, name string) (lim *rateLimit, rev uint64, refused protocol.Message) {
	s := f.s
	s.mu.Lock()
	defer s.unlock()
	if s.fenced != nil {
		return nil, 0, s.refuse()
	}
	if lim = f.limits.get(scope, name); lim != nil {
		rev = lim.rev
	}
	return lim, rev, nil
}

// removeLimit removes a rate limit: durable first, then out of force.
func (f *flow) removeLimit(ctx context.Context, req *protocol.RemoveLimit) protocol.Message {
	if err := protocol.CheckLimitTarget(req.Scope, req.Name); err != nil {
		return protocol.BadLimit(err)
	}
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	lim, rev, refused := f.current(req.Scope, req.Name)
	s := f.s
	key := protocol.LimitControlKey(req.Scope, req.Name)
	if lim == nil && refused == nil && s.catchUp(key, 0, func(stored *control) { f.adopt(key, stored) }) {
		lim, rev, refused = f.current(req.Scope, req.Name)
	}
	switch {
	case refused != nil:
		return refused
	case lim == nil:
		return protocol.UnknownLimit(req.Scope, req.Name)
	}
	if _, err := f.write(ctx, key, nil, rev); err != nil {
		return controlFailed("limit of "+req.Scope+" "+req.Name, err)
	}
	s.mu.Lock()
	defer s.unlock()
	info := lim.info(s.now())
	f.limits.remove(req.Scope, req.Name)
	s.log.Info("rate limit removed", "scope", req.Scope, "name", req.Name)
	s.schedule()
	return settled{&protocol.LimitRemoved{Limit: info}}
}

// listLimits is every limit's state now.
func (f *flow) listLimits() protocol.Message {
	s := f.s
	s.mu.Lock()
	defer s.unlock()
	if s.fenced != nil {
		return s.refuse()
	}
	return &protocol.LimitList{Limits: f.limits.list(s.now())}
}

// limitStats is every limit's state now, for Stats.
func (f *flow) limitStats() []protocol.LimitInfo {
	s := f.s
	s.mu.Lock()
	defer s.unlock()
	return f.limits.list(s.now())
}

// write stores value (nil: the removal) as the limit's setting under key, a CAS on
// rev, the revision memory holds (writeControl settles a write whose answer was lost).
// If the store holds another's setting instead, memory adopts it, and the error says so.
func (f *flow) write(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	wctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	was := rev
	rev, err := writeControl(wctx, f.s.store.controls(), key, value, rev)
	var changed *controlChanged
	switch {
	case errors.As(err, &changed):
		f.adopt(key, changed.stored)
	case errors.Is(err, errControlUnknown):
		f.follow(key, was)
	}
	return rev, err
}

// follow has the limit's setting under key read back after a write of it was answered
// "Outcome unknown" while memory held revision rev (0: none), and taken on once the
// store holds another (scheduler.follow).
func (f *flow) follow(key string, rev uint64) {
	s := f.s
	scope, name, _ := strings.Cut(strings.TrimPrefix(key, protocol.LimitControlPrefix), ".")
	rb := s.follows.begin(key)
	holds := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		var held uint64
		if lim := f.limits.get(scope, name); lim != nil {
			held = lim.rev
		}
		return held == rev && rb.unchanged()
	}
	s.follow(rb, rev, holds, adoptUnder(&f.writeMu, holds, func(stored *control) { f.adopt(key, stored) }))
}

// adopt makes memory hold the setting stored under key (nil: none), and dispatches
// what a limit raised or gone lets start.
func (f *flow) adopt(key string, c *control) {
	s := f.s
	s.mu.Lock()
	defer s.unlock()
	scope, name, _ := strings.Cut(strings.TrimPrefix(key, protocol.LimitControlPrefix), ".")
	if c == nil {
		f.limits.remove(scope, name)
		s.schedule()
		return
	}
	var spec protocol.LimitSpec
	if json.Unmarshal(c.value, &spec) != nil {
		return
	}
	if r, err := protocol.ParseRate(spec.Rate); err == nil {
		f.limits.set(scope, name, r, spec.Burst, c.rev, false, s.now())
		s.schedule()
	}
}

// controlFailed is the answer to a write of a setting that failed: changed meanwhile
// (memory now holds what is stored), not known to have landed, or not stored.
func controlFailed(what string, err error) *protocol.Error {
	switch {
	case errors.Is(err, errControlChanged):
		return &protocol.Error{Message: fmt.Sprintf("the %s changed meanwhile (%v); nothing was written, try again", what, err)}
	case errors.Is(err, errControlUnknown):
		return protocol.OutcomeUnknownSetting("the "+what, "stored", err.Error())
	}
	return &protocol.Error{Message: fmt.Sprintf("%v: the %s was not stored (%v)", ErrNotServing, what, err)}
}
