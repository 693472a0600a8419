package coordinator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Controls are the coordinator's durable settings beside its jobs: a queue's pause and
// limits, a rate limit, a schedule, a workflow, a batch. Each is a value (JSON of its
// owner's choosing) under a key "<kind>.<name>", stored in the jobs bucket under
// protocol.ControlPrefix, where a record scan never sees it, and changed only as a
// CAS on the revision it was read at. Only the leader writes them: the API checks
// the lease before a write, as it does for every request that changes state. The
// leader that recovers reads them back (list) and re-arms what they imply (timers,
// pauses, buckets). A write answered "Outcome unknown" may still be committed long
// after its answer, and nobody may send it again: the leader reads its setting back
// until the store settles it (follow), so that what it enforces is what is stored.

// errControlChanged means a control changed (or appeared, or went) since it was read:
// read it again and decide again.
var errControlChanged = errors.New("setting changed since it was read")

// errControlUnknown: whether a setting's write landed is not known.
var errControlUnknown = errors.New("outcome unknown")

// controlTimeout bounds a write of a setting, and the read back that settles it.
const controlTimeout = 5 * time.Second

// control is one stored setting.
type control struct {
	key   string // "<kind>.<name>", without protocol.ControlPrefix
	value []byte
	rev   uint64
}

// controlStore reads and writes controls.
type controlStore interface {
	// put creates key (rev 0) or replaces it (a CAS on rev); errControlChanged when
	// the store holds another revision. It returns the new revision.
	put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
	// remove deletes key: a CAS on rev, or whatever its revision with rev 0.
	// Removing a key that is not there is no error.
	remove(ctx context.Context, key string, rev uint64) error
	// get reads key; ok is false when it is not stored.
	get(ctx context.Context, key string) (c control, ok bool, err error)
	// list returns every control whose key starts with prefix ("queue."), by key.
	list(ctx context.Context, prefix string) ([]control, error)
}

// writeControl stores value under key, a CAS on rev (0: a create), or removes key when
// value is nil (a CAS on rev; whatever its revision with rev 0), and returns the
// revision stored (0 once removed). ctx bounds the write.
//
// A write that fails is settled by reading key back: its answer may have been lost (a
// timeout, a lost connection) while it landed, or an earlier write of the same value,
// whose answer was lost, may have landed (and so this one's revision is stale). Then:
//   - the store holds value (a removal: nothing): it landed, and no error;
//   - it holds what was read at rev, and the store refused the write: nothing landed,
//     and the write's error;
//   - it holds what was read at rev, and the write went unanswered: errControlUnknown.
//     In a cluster the stream's leader may have proposed it and not yet committed it,
//     so it is not in the store yet and can still be committed later (once a
//     follower answers, or by the next leader);
//   - it holds what was read at rev, and the store refused the write because an
//     earlier write of key is still being committed (pendingEarlier): errControlUnknown,
//     as that earlier write was answered: most likely it is this setting's, sent again
//     after that answer, and it can still land;
//   - it holds something else: a *controlChanged (errors.Is errControlChanged) that
//     says what, for the caller to adopt;
//   - it cannot be read: errControlUnknown, or errControlChanged if the store refused
//     the write for its revision (then nothing landed).
func writeControl(ctx context.Context, cs controlStore, key string, value []byte, rev uint64) (uint64, error) {
	var got uint64
	var err error
	if value == nil {
		err = cs.remove(ctx, key, rev)
	} else {
		got, err = cs.put(ctx, key, value, rev)
	}
	if err == nil {
		return got, nil
	}
	// The read back has time of its own (the write's may be what ran out), but ends
	// with ctx's cancellation: the caller is stopping.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), controlTimeout)
	defer cancel()
	defer context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			cancel()
		}
	})()
	cur, stored, rerr := cs.get(rctx, key)
	switch {
	case rerr != nil && errors.Is(err, errControlChanged):
		return 0, err
	case rerr != nil:
		return 0, fmt.Errorf("%s: %w: %w; reading it back failed too: %w", key, errControlUnknown, err, rerr)
	case value == nil && !stored:
		return 0, nil
	case value != nil && stored && bytes.Equal(cur.value, value):
		return cur.rev, nil
	case !stored && rev == 0, stored && (cur.rev == rev || value == nil && rev == 0):
		if pendingEarlier(err) {
			// Refused while an earlier write of key waits in the stream leader's log:
			// most likely this setting's, answered "Outcome unknown" and sent again.
			// That one may still land, so this one is answered as it was.
			return 0, fmt.Errorf("%s: %w: an earlier write of it is not settled yet: %w", key, errControlUnknown, err)
		}
		if !errors.Is(err, errControlChanged) && !refusedOutright(err) {
			return 0, fmt.Errorf("%s: %w: %w; it is not stored yet", key, errControlUnknown, err)
		}
		return 0, err // nothing landed, nor can
	}
	changed := &controlChanged{key: key, err: err}
	if stored {
		changed.stored = &cur
	}
	return 0, changed
}

// controlChanged is a write of a setting refused, or not landed, because another
// changed it since it was read: stored is what the store holds instead (nil: nothing).
type controlChanged struct {
	key    string
	stored *control
	err    error // the write's own
}

func (e *controlChanged) Error() string {
	now := "not stored now"
	if e.stored != nil {
		now = fmt.Sprintf("revision %d stored now", e.stored.rev)
	}
	msg := fmt.Sprintf("%s: %v (%s)", e.key, errControlChanged, now)
	if !errors.Is(e.err, errControlChanged) {
		msg += ": " + e.err.Error()
	}
	return msg
}

func (e *controlChanged) Unwrap() []error { return []error{errControlChanged, e.err} }

// followFirst and followMax bound the wait before each read of a setting followed.
const (
	followFirst = 500 * time.Millisecond
	followMax   = 10 * time.Second
)

// follows runs the read-backs of settings whose write was answered "Outcome unknown"
// (scheduler.follow), until the coordinator stops.
type follows struct {
	*goroutines

	mu    sync.Mutex
	reads map[string]*readBack // each key followed, by its current read-back (start)
	// changes counts, by key, the settings memory took on where a read-back must notice
	// any change, even one back to the revision it follows (a removal's 0): changed.
	// A read-back compares only the changes since it began (begin), so a key is counted
	// only while a read-back of it is begun and not ended: changes holds the settings
	// read back now, not every one ever written.
	changes map[string]*changeCount
}

// changeCount counts a key's changes for the read-backs of it that look.
type changeCount struct {
	n       uint64 // the settings of the key memory took on
	readers int    // its read-backs begun and not ended
}

func newFollows() *follows {
	return &follows{goroutines: newGoroutines(), reads: make(map[string]*readBack), changes: make(map[string]*changeCount)}
}

// readBack is one read-back of setting key, from its begin to the end of its run
// (start); end ends its run.
type readBack struct {
	f     *follows
	key   string
	count *changeCount // key's, kept in changes until every read-back of key ended
	at    uint64       // count.n at begin
	end   context.CancelFunc
}

// changed notes that memory took on a setting of key (a queue's settings applied, a
// limit set or removed, a schedule entered).
func (f *follows) changed(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.changes[key]; c != nil { // else none looks: one begun later counts from then
		c.n++
	}
}

// begin begins a read-back of setting key, for follow to run: from now, unchanged
// reports whether memory took on a setting of key. Every read-back begun is run, and
// ends with its run.
func (f *follows) begin(key string) *readBack {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.changes[key]
	if c == nil {
		c = new(changeCount)
		f.changes[key] = c
	}
	c.readers++
	return &readBack{f: f, key: key, count: c, at: c.n}
}

// unchanged reports whether memory has taken on no setting of rb's key (changed) since
// rb began: a read-back's holds ends with it.
func (rb *readBack) unchanged() bool {
	rb.f.mu.Lock()
	defer rb.f.mu.Unlock()
	return rb.count.n == rb.at
}

// ended notes that rb's run ended: once none of its key's read-backs looks, its count
// goes. Called with f.mu held.
func (f *follows) ended(rb *readBack) {
	if f.reads[rb.key] == rb {
		delete(f.reads, rb.key)
	}
	if rb.count.readers--; rb.count.readers == 0 {
		delete(f.changes, rb.key)
	}
}

// start runs fn, rb's read-back, on a goroutine that stop ends and waits for, unless
// stopped. fn's ctx also ends when a later write of rb's key starts another: its
// read-back replaces this one, even from the same revision, since the earlier one's
// holds may report a change that the later write made (a schedule's add sent again
// enters the name again), and end before the setting is settled, with nothing left to
// take on what lands.
func (f *follows) start(rb *readBack, fn func(ctx context.Context)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ctx, end := context.WithCancel(f.ctx)
	rb.end = end
	if !f.goRun(func() {
		defer end()
		fn(ctx)
		f.mu.Lock()
		f.ended(rb)
		f.mu.Unlock()
	}) {
		end()
		f.ended(rb)
		return
	}
	if was, ok := f.reads[rb.key]; ok {
		was.end()
	}
	f.reads[rb.key] = rb
}

// following reports whether setting key is being read back: a write of it was answered
// "Outcome unknown", and memory may not hold what the store does.
func (f *follows) following(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.reads[key]
	return ok
}

// catchUp has memory take on setting key as stored, for a command that memory finds
// has nothing to do (it holds no such setting, or holds it as the command would make
// it) while key is followed (following): a write of it answered "Outcome unknown" may
// have landed since, and answered from memory the command would say what the store
// does not hold, until the read-back takes the landed write on and undoes the command.
// So key is read, and if the store holds another revision than rev, memory's (0:
// none), adopt takes on what it holds (nil: nothing, never when rev is 0), for the
// command to apply to. catchUp reports whether adopt was called; a setting not
// followed, or not read, is left as memory holds it.
func (s *scheduler) catchUp(key string, rev uint64, adopt func(stored *control)) bool {
	if !s.follows.following(key) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
	defer cancel()
	c, stored, err := s.store.controls().get(ctx, key)
	switch {
	case err != nil, stored && c.rev == rev, !stored && rev == 0:
		return false
	case stored:
		adopt(&c)
	default:
		adopt(nil)
	}
	return true
}

// follow runs rb (follows.begin): it reads setting rb.key back after a write of it was
// answered "Outcome unknown" while memory held revision rev of it (0: none stored).
// Memory kept that one, but the write may still land: a cluster's stream leader without
// a quorum commits it once a follower answers, which may be long after. So key is read,
// at growing intervals, until the store holds another revision (or none, or one); then
// adopt takes on what it holds (nil: nothing), under the locks of the setting's writes,
// and only while holds still reports that memory holds rev: a write of the setting
// since, or one found changed, is newer. It ends once holds does not, a later write of
// key answered so is followed instead (follows.start), or the coordinator stops or is
// fenced. A write that never lands is followed on, a read every followMax, until then.
func (s *scheduler) follow(rb *readBack, rev uint64, holds func() bool, adopt func(stored *control) bool) {
	key := rb.key
	s.follows.start(rb, func(ctx context.Context) {
		for wait := followFirst; ; wait = min(2*wait, followMax) {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if s.fencedBy() != nil || !holds() {
				return
			}
			rctx, cancel := context.WithTimeout(ctx, controlTimeout)
			c, stored, err := s.store.controls().get(rctx, key)
			cancel()
			if err != nil || stored && c.rev == rev || !stored && rev == 0 {
				continue // not settled yet, or unreadable for now
			}
			var now *control
			if stored {
				now = &c
			}
			if adopt(now) {
				s.log.Info("a setting answered 'Outcome unknown' is settled in the store; taken on", "key", key, "stored", stored)
			}
			return
		}
	})
}

// adoptUnder is a follow's adopt for a setting whose writes hold lock: under it, and
// only while holds still reports that memory holds the revision followed, adopt takes
// on what is stored.
func adoptUnder(lock sync.Locker, holds func() bool, adopt func(stored *control)) func(stored *control) bool {
	return func(stored *control) bool {
		lock.Lock()
		defer lock.Unlock()
		if !holds() {
			return false
		}
		adopt(stored)
		return true
	}
}

// kvControls keeps controls in the jobs bucket, whose stream list reads. A setting is
// read with read (jsStore.readRecord): in a cluster from the stream's leader, which has
// every write it acknowledged, rather than from any replica, which may lag.
type kvControls struct {
	kv     jetstream.KeyValue
	stream jetstream.Stream
	read   func(ctx context.Context, key string) ([]byte, uint64, error)
}

func (c kvControls) put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	var err error
	var got uint64
	if rev == 0 {
		got, err = c.kv.Create(ctx, protocol.ControlPrefix+key, value)
	} else {
		got, err = c.kv.Update(ctx, protocol.ControlPrefix+key, value, rev)
	}
	if isCASConflict(err) && !pendingEarlier(err) { // that one says nothing of the store: writeControl reads it
		return 0, fmt.Errorf("%s: %w", key, errControlChanged)
	}
	if err != nil {
		return 0, fmt.Errorf("store setting %s: %w", key, err)
	}
	return got, nil
}

func (c kvControls) remove(ctx context.Context, key string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	err := c.kv.Purge(ctx, protocol.ControlPrefix+key, opts...)
	switch {
	case isCASConflict(err) && !pendingEarlier(err):
		return fmt.Errorf("%s: %w", key, errControlChanged)
	case err != nil && !errors.Is(err, jetstream.ErrKeyNotFound):
		return fmt.Errorf("remove setting %s: %w", key, err)
	}
	return nil
}

func (c kvControls) get(ctx context.Context, key string) (control, bool, error) {
	data, rev, err := c.read(ctx, protocol.ControlPrefix+key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return control{}, false, nil
	}
	if err != nil {
		return control{}, false, fmt.Errorf("read setting %s: %w", key, err)
	}
	return control{key: key, value: data, rev: rev}, true, nil
}

func (c kvControls) list(ctx context.Context, prefix string) ([]control, error) {
	// Not kv.ListKeysFiltered: a deposed leader's write meanwhile could hide a key from
	// it (kvKeys), and a paused queue read as resumed, a schedule as gone. Each key's
	// last message comes with its value, read until none is pending: a key rewritten
	// meanwhile comes again, later, and one removed comes as its removal.
	last := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		FilterSubjects: []string{jobsSubjects + protocol.ControlPrefix + prefix + ">"}}
	byKey := make(map[string]control)
	err := consume(ctx, c.stream, last, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) {
		key := strings.TrimPrefix(msg.Subject(), jobsSubjects+protocol.ControlPrefix)
		if removal(msg.Headers()) {
			delete(byKey, key)
			return
		}
		byKey[key] = control{key: key, value: msg.Data(), rev: meta.Sequence.Stream}
	}, jetstream.PullMaxMessages(64)) // values, unlike headers, may be large
	if err != nil {
		return nil, fmt.Errorf("list settings %s: %w", prefix, err)
	}
	out := slices.Collect(maps.Values(byKey))
	slices.SortFunc(out, func(a, b control) int { return strings.Compare(a.key, b.key) })
	return out, nil
}

// isCASConflict reports whether err is JetStream refusing a write for its expected
// revision: the key exists (a create) or holds another revision (an update).
func isCASConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || wrongLastSequence(err)
}

// memControls keeps controls in a memBackend, with the same revisions as its records.
type memControls struct{ b *memBackend }

func (c memControls) put(_ context.Context, key string, value []byte, rev uint64) (uint64, error) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.controls[key].seq != rev {
		return 0, fmt.Errorf("%s: %w", key, errControlChanged)
	}
	b.seq++
	b.controls[key] = memMessage{data: slices.Clone(value), seq: b.seq, at: b.clock()}
	return b.seq, nil
}

func (c memControls) remove(_ context.Context, key string, rev uint64) error {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	m, ok := b.controls[key]
	if rev != 0 && m.seq != rev {
		return fmt.Errorf("%s: %w", key, errControlChanged)
	}
	if ok {
		delete(b.controls, key)
	}
	return nil
}

func (c memControls) get(_ context.Context, key string) (control, bool, error) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	m, ok := b.controls[key]
	if !ok {
		return control{}, false, nil
	}
	return control{key: key, value: slices.Clone(m.data), rev: m.seq}, true, nil
}

func (c memControls) list(_ context.Context, prefix string) ([]control, error) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []control
	for k, m := range b.controls {
		if strings.HasPrefix(k, prefix) {
			out = append(out, control{key: k, value: slices.Clone(m.data), rev: m.seq})
		}
	}
	slices.SortFunc(out, func(a, b control) int { return strings.Compare(a.key, b.key) })
	return out, nil
}
