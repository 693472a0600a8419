package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// The queue API (jobbus.api.queue.*): list the queues, pause and resume one, set its
// limits. A queue's settings are durable: the controls hold them under
// protocol.QueueControlPrefix + name (controls.go), written by the leader only, CAS on
// the revision it last read or wrote; a new leader reads them all before it schedules
// (loadQueues).

// serveQueues serves the queue API's requests.
func (a *api) serveQueues(m protocol.Message, from request, reply replyFunc) {
	s := a.sched
	switch m := m.(type) {
	case *protocol.ListQueues:
		reply(&protocol.QueueList{Queues: s.queueList()})
	case *protocol.PauseQueue:
		reply(s.changeQueue(m.Queue, false, from.due, func(st *protocol.QueueSettings) { st.Paused = true }))
	case *protocol.ResumeQueue:
		reply(s.changeQueue(m.Queue, false, from.due, func(st *protocol.QueueSettings) { st.Paused = false }))
	case *protocol.SetQueue:
		reply(s.changeQueue(m.Queue, true, from.due, func(st *protocol.QueueSettings) {
			if m.MaxRunning != nil {
				st.MaxRunning = *m.MaxRunning
			}
			if m.KeyConcurrency != nil {
				st.KeyConcurrency = *m.KeyConcurrency
			}
		}))
	default:
		reply(&protocol.Error{Message: fmt.Sprintf("Unsupported request: %s", m.MessageType())})
	}
}

// errQueueSettingsChanged: the stored settings are not those this coordinator last knew.
var errQueueSettingsChanged = errors.New("the queue's stored settings changed meanwhile (another coordinator may lead); read again and retry")

// changeQueue applies change to the settings of the queue named name and answers once
// they are durable: QUEUE_UPDATED, or an ERROR when nothing was stored. A queue not
// known is an error unless create.
func (s *scheduler) changeQueue(name string, create bool, due time.Duration, change func(*protocol.QueueSettings)) protocol.Message {
	if err := protocol.CheckQueueName(name); err != nil {
		return &protocol.Error{Message: "Invalid queue: " + err.Error()}
	}
	s.queueWrites.Lock()
	defer s.queueWrites.Unlock()
	adopt := func(stored *control) { s.adoptQueueSettings(name, stored) }
	s.mu.Lock()
	if s.fenced != nil {
		defer s.unlock()
		return s.refuse()
	}
	q := s.ready.queues[name]
	if q == nil && !create {
		s.unlock()
		if !s.catchUp(protocol.QueueControlPrefix+name, 0, adopt) {
			return protocol.UnknownQueue(name)
		}
		s.mu.Lock()
		q = s.ready.queues[name]
	}
	var cur protocol.QueueSettings
	var rev uint64
	if q != nil {
		cur, rev = q.settings, q.rev
	}
	s.unlock()
	next := cur
	change(&next)
	if err := next.Check(); err != nil {
		return &protocol.Error{Message: "Invalid queue settings: " + err.Error()}
	}
	if next == cur && q != nil && s.catchUp(protocol.QueueControlPrefix+name, rev, adopt) {
		s.mu.Lock()
		cur, rev = q.settings, q.rev
		s.unlock()
		next = cur
		change(&next)
	}
	if next != cur || q == nil {
		ctx, cancel := context.WithTimeout(context.Background(), max(due, time.Second))
		defer cancel()
		newRev, err := s.storeQueueSettings(ctx, name, next, rev)
		var changed *controlChanged
		switch {
		case errors.Is(err, errControlChanged):
			if errors.As(err, &changed) { // else not read back: the next write reads it
				s.adoptQueueSettings(name, changed.stored)
			}
			err = errQueueSettingsChanged
		case errors.Is(err, errControlUnknown):
			s.followQueue(name, rev)
			return protocol.OutcomeUnknownSetting("the settings of queue "+name, "stored", err.Error())
		}
		if err != nil {
			return &protocol.Error{Message: fmt.Sprintf("queue %s: settings not stored: %v", name, err)}
		}
		rev = newRev
	}
	s.mu.Lock()
	defer s.unlock()
	q = s.ready.queue(name)
	s.applyQueueSettings(q, next, rev)
	return &protocol.QueueUpdated{Queue: s.queueInfo(q, s.now())}
}

// storeQueueSettings writes st as the queue's control, CAS on rev (0: create), and
// returns its new revision; settings back to the defaults remove the control. A write
// whose answer was lost is settled as writeControl says.
func (s *scheduler) storeQueueSettings(ctx context.Context, name string, st protocol.QueueSettings, rev uint64) (uint64, error) {
	if st == (protocol.QueueSettings{}) && rev == 0 {
		return 0, nil // none stored, none to store
	}
	var value []byte // nil: the removal
	if st != (protocol.QueueSettings{}) {
		var err error
		if value, err = json.Marshal(st); err != nil {
			return 0, err
		}
	}
	return writeControl(ctx, s.store.controls(), protocol.QueueControlPrefix+name, value, rev)
}

// applyQueueSettings makes st q's settings, and dispatches what they let start. Called
// with the scheduler's mu held.
func (s *scheduler) applyQueueSettings(q *jobQueue, st protocol.QueueSettings, rev uint64) {
	was := q.settings
	q.settings, q.rev = st, rev
	s.follows.changed(protocol.QueueControlPrefix + q.name)
	if st.Paused != was.Paused {
		s.log.Info("queue settings changed", "queue", q.name, "paused", st.Paused, "max_running", st.MaxRunning, "key_concurrency", st.KeyConcurrency)
	}
	if st.KeyConcurrency != was.KeyConcurrency {
		q.unparkAll(s.laneLimit)
	}
	s.schedule()
}

// adoptQueueSettings makes the queue's settings those stored (nil: none, the
// defaults), after a write found them changed. Unreadable ones leave memory as it
// is, as loadQueues ignores them.
func (s *scheduler) adoptQueueSettings(name string, stored *control) {
	var st protocol.QueueSettings
	var rev uint64
	if stored != nil {
		if err := json.Unmarshal(stored.value, &st); err != nil {
			return
		}
		rev = stored.rev
	}
	s.mu.Lock()
	defer s.unlock()
	s.applyQueueSettings(s.ready.queue(name), st, rev)
}

// followQueue has the queue's settings read back after a write of them was answered
// "Outcome unknown" while memory held revision rev (0: none stored), and taken on once
// the store holds others (follow).
func (s *scheduler) followQueue(name string, rev uint64) {
	rb := s.follows.begin(protocol.QueueControlPrefix + name)
	holds := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		q := s.ready.queues[name]
		return q == nil && rev == 0 || q != nil && q.rev == rev && rb.unchanged()
	}
	s.follow(rb, rev, holds, adoptUnder(&s.queueWrites, holds, func(stored *control) {
		s.adoptQueueSettings(name, stored)
	}))
}

// loadQueues reads every queue's stored settings: a new leader does, before it
// schedules anything, so that a paused queue stays paused across a failover.
func (s *scheduler) loadQueues(ctx context.Context) error {
	cs, err := s.store.controls().list(ctx, protocol.QueueControlPrefix)
	if err != nil {
		return fmt.Errorf("read queue settings: %w", err)
	}
	s.mu.Lock()
	defer s.unlock()
	for _, c := range cs {
		name := strings.TrimPrefix(c.key, protocol.QueueControlPrefix)
		var st protocol.QueueSettings
		if err := protocol.CheckQueueName(name); err != nil {
			s.log.Warn("queue settings under a bad name; ignored", "key", c.key)
			continue
		}
		if err := json.Unmarshal(c.value, &st); err != nil {
			s.log.Warn("queue settings unreadable; ignored", "queue", name, "err", err)
			continue
		}
		q := s.ready.queue(name)
		q.settings, q.rev = st, c.rev
		if st.Paused {
			s.log.Info("queue paused", "queue", name)
		}
	}
	return nil
}

// queueList is every queue, by name.
func (s *scheduler) queueList() []protocol.QueueInfo {
	s.mu.Lock()
	defer s.unlock()
	now := s.now()
	out := make([]protocol.QueueInfo, 0, len(s.ready.queues))
	for _, q := range s.ready.queues {
		out = append(out, s.queueInfo(q, now))
	}
	slices.SortFunc(out, func(a, b protocol.QueueInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// queueInfo is q as it stands. Called with the scheduler's mu held.
func (s *scheduler) queueInfo(q *jobQueue, now time.Time) protocol.QueueInfo {
	info := protocol.QueueInfo{Name: q.name, QueueSettings: q.settings, Queued: q.size, Running: q.running,
		Unfinished: q.unfinished, Keys: q.keys(), Started: q.started, Throttled: q.throttled, StartedPerMinute: q.perMinute(now)}
	if at, ok := q.oldest(); ok {
		info.LatencyMillis = max(0, now.UnixMilli()-at)
	}
	for _, w := range s.reg.workers {
		if w.serves(q.name) {
			info.Workers++
		}
	}
	return info
}
