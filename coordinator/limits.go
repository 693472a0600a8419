package coordinator

import (
	"cmp"
	"slices"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// limiter holds the rate limits of task types and queues and their token buckets, in
// the leader's memory: dispatch asks it whether a job may start (admits) and tells it
// when one did (started). Guarded by the scheduler's mu.
//
// A limit's setting is durable (a control, limit.<scope>.<name>); its bucket is not.
// A coordinator that takes the lead starts every bucket empty: the leader before it may
// have spent the whole burst just before it stopped, and an empty bucket then allows at
// most rate*w starts in the first w, so that the two leaders together never exceed
// burst + rate*w in any window w (no second above rate + burst). A limit set while
// leading starts full.
type limiter struct {
	byType  map[string]*rateLimit
	byQueue map[string]*rateLimit
	// changed, when set, is told the key of each limit set or removed: a read-back
	// (flow.follow) ends once it changes, even back to the revision it follows (none,
	// after a removal).
	changed func(key string)
}

// rateLimit is one limit and its bucket.
type rateLimit struct {
	scope, name string
	rate        protocol.Rate
	burst       int64
	rev         uint64 // of its control
	bucket      *tokenBucket
	throttled   uint64 // starts that waited for a token
	refused     bool   // a start was refused since the last one
}

func newLimiter() *limiter {
	return &limiter{byType: make(map[string]*rateLimit), byQueue: make(map[string]*rateLimit)}
}

func (l *limiter) table(scope string) map[string]*rateLimit {
	if scope == protocol.LimitQueue {
		return l.byQueue
	}
	return l.byType
}

// get returns the limit of scope on name, or nil.
func (l *limiter) get(scope, name string) *rateLimit { return l.table(scope)[name] }

// set creates or reshapes the limit of scope on name; a new one starts full when full.
func (l *limiter) set(scope, name string, r protocol.Rate, burst int64, rev uint64, full bool, now time.Time) *rateLimit {
	l.tell(scope, name)
	t := l.table(scope)
	if lim := t[name]; lim != nil {
		lim.rate, lim.burst, lim.rev = r, burst, rev
		lim.bucket.reshape(r, burst, now)
		return lim
	}
	lim := &rateLimit{scope: scope, name: name, rate: r, burst: burst, rev: rev, bucket: newTokenBucket(r, burst, full, now)}
	t[name] = lim
	return lim
}

// remove forgets the limit of scope on name.
func (l *limiter) remove(scope, name string) {
	l.tell(scope, name)
	delete(l.table(scope), name)
}

// tell tells changed, if set, that the limit of scope on name changed.
func (l *limiter) tell(scope, name string) {
	if l.changed != nil {
		l.changed(protocol.LimitControlKey(scope, name))
	}
}

// empty reports whether no limit is set: dispatch's common case costs two map lengths.
func (l *limiter) empty() bool { return len(l.byType) == 0 && len(l.byQueue) == 0 }

// admits reports whether a job of queue and taskType may start at now; if not, when
// a token will be there (dispatch looks again then).
func (l *limiter) admits(queue, taskType string, now time.Time) (ok bool, next time.Time) {
	if l.empty() {
		return true, time.Time{}
	}
	ok = true
	for _, lim := range [2]*rateLimit{l.byType[taskType], l.byQueue[protocol.QueueOf(queue)]} {
		if lim == nil {
			continue
		}
		if yes, at := lim.bucket.allow(now); !yes {
			ok = false
			if at.After(next) { // both must have a token
				next = at
			}
			lim.refused = true
		}
	}
	return ok, next
}

// started takes a token for a job of queue and taskType that starts at now.
func (l *limiter) started(queue, taskType string, now time.Time) {
	if l.empty() {
		return
	}
	for _, lim := range [2]*rateLimit{l.byType[taskType], l.byQueue[protocol.QueueOf(queue)]} {
		if lim == nil {
			continue
		}
		lim.bucket.take(now)
		if lim.refused {
			lim.throttled++
			lim.refused = false
		}
	}
}

// unstarted gives back the token a job of queue and taskType took when it was
// assigned, at now: its assignment never reached a worker, so nothing started.
func (l *limiter) unstarted(queue, taskType string, now time.Time) {
	if l.empty() {
		return
	}
	for _, lim := range [2]*rateLimit{l.byType[taskType], l.byQueue[protocol.QueueOf(queue)]} {
		if lim != nil {
			lim.bucket.giveBack(now)
		}
	}
}

// info is lim's state at now.
func (lim *rateLimit) info(now time.Time) protocol.LimitInfo {
	in := protocol.LimitInfo{
		Scope: lim.scope, Name: lim.name, Rate: lim.rate.String(), Burst: lim.burst,
		PerSecond: lim.rate.PerSecond(), Tokens: lim.bucket.tokens(now), Throttled: lim.throttled,
	}
	if ok, next := lim.bucket.allow(now); !ok {
		in.NextTokenMillis = next.UnixMilli()
	}
	return in
}

// list is every limit's state at now, sorted by scope and name.
func (l *limiter) list(now time.Time) []protocol.LimitInfo {
	out := make([]protocol.LimitInfo, 0, len(l.byType)+len(l.byQueue))
	for _, t := range []map[string]*rateLimit{l.byQueue, l.byType} {
		for _, lim := range t {
			out = append(out, lim.info(now))
		}
	}
	slices.SortFunc(out, func(a, b protocol.LimitInfo) int {
		return cmp.Or(cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Name, b.Name))
	})
	return out
}
