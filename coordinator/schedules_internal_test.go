package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// answerLosingStore is a JetStream store whose settings' writes, while lose is set,
// land and lose their answer, and cannot be read back: a write's outcome unknown, as a
// timeout or a dropped connection leaves it.
type answerLosingStore struct {
	jobStore
	lose *atomic.Bool
}

func (s answerLosingStore) controls() controlStore {
	return switchedControls{s.jobStore.controls(), s.lose}
}

type switchedControls struct {
	controlStore
	lose *atomic.Bool
}

func (c switchedControls) lossy() controlStore {
	if !c.lose.Load() {
		return c.controlStore
	}
	return lossyControls{controlStore: c.controlStore, lose: true, landed: true, unread: true}
}

func (c switchedControls) put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	return c.lossy().put(ctx, key, value, rev)
}

func (c switchedControls) remove(ctx context.Context, key string, rev uint64) error {
	return c.lossy().remove(ctx, key, rev)
}

func (c switchedControls) get(ctx context.Context, key string) (control, bool, error) {
	return c.lossy().get(ctx, key)
}

// startAnswerLosing starts a coordinator on an answerLosingStore and a real embedded
// server; lose switches the store's losing on.
func startAnswerLosing(t *testing.T) (*Coordinator, *client.Client, *atomic.Bool) {
	t.Helper()
	ctx := context.Background()
	nc, _ := loneServer(t) // diagnose_test.go
	lose := new(atomic.Bool)
	c := &Coordinator{cfg: DefaultConfig()}
	c.cfg.fill()
	c.build(nc, answerLosingStore{newJetStreamStore(nc, &c.cfg), lose})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, client.New(nc), lose
}

// TestSchedulePauseOfUnknownOutcomeOutlivesTheNextTick: a pause answered "Outcome
// unknown" whose write landed is not undone by the schedule's next tick, which finds
// the stored schedule changed and writes its tick over it, keeping the stored pause.
// (The coordinator's read-back of the schedule, follow, would take the pause on
// before the tick: it is stopped here, so that the tick meets the pause first, as it
// may when it comes before the read-back.)
func TestSchedulePauseOfUnknownOutcomeOutlivesTheNextTick(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, cl, lose := startAnswerLosing(t)
	c.sched.follows.stop()
	spec := client.Schedule{Name: "p", Every: time.Second, TaskType: "SHA256", Payload: map[string]string{"text": "p"}}
	if _, err := cl.AddSchedule(ctx, spec); err != nil {
		t.Fatal(err)
	}
	lose.Store(true)
	_, err := cl.PauseSchedule(ctx, "p")
	lose.Store(false)
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("pause whose write landed, its answer lost: %v; want Outcome unknown", err)
	}
	var sc protocol.Schedule
	paused := time.Now().UnixMilli()
	eventuallyTrue(t, "a tick written after the pause", func() bool {
		cur, ok, err := c.store.controls().get(ctx, protocol.SchedulePrefix+"p")
		if err != nil || !ok {
			t.Fatalf("schedule p: stored %v, %v", ok, err)
		}
		if err := json.Unmarshal(cur.value, &sc); err != nil {
			t.Fatal(err)
		}
		return sc.LastTickMillis > paused
	})
	if !sc.Paused {
		t.Fatalf("stored %+v after a tick: the pause that landed is undone", sc)
	}
	// The tick's write is stored before the coordinator records it: listed once it has.
	eventuallyTrue(t, "p listed paused, as stored", func() bool {
		scs, err := cl.Schedules(ctx)
		return err == nil && len(scs) == 1 && scs[0].Paused
	})
}

// TestScheduleWriteOfUnknownOutcome: a schedule added, paused or removed whose write
// landed while its answer was lost, and could not be read back, is answered "Outcome
// unknown", not as a change not stored: it is stored. Sent again once the store
// answers, each is answered as done, and the list shows what the store holds.
func TestScheduleWriteOfUnknownOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, cl, lose := startAnswerLosing(t)
	stored := func(name string) bool {
		t.Helper()
		_, ok, err := c.store.controls().get(ctx, protocol.SchedulePrefix+name)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	listed := func() []string {
		t.Helper()
		scs, err := cl.Schedules(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, sc := range scs {
			names = append(names, sc.Name+map[bool]string{true: " paused"}[sc.Paused])
		}
		return names
	}
	spec := client.Schedule{Name: "a", Every: time.Hour, TaskType: "SHA256", Payload: map[string]string{"text": "a"}}
	unknown := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Fatalf("%s whose write landed, its answer lost: %v; want Outcome unknown", what, err)
		}
	}

	lose.Store(true)
	_, err := cl.AddSchedule(ctx, spec)
	lose.Store(false)
	unknown("add", err)
	if !stored("a") {
		t.Fatal("the add's write did not land: the fault is not the one meant")
	}
	if sc, err := cl.AddSchedule(ctx, spec); err != nil || sc.Name != "a" {
		t.Fatalf("the add sent again: %+v %v, want the schedule stored", sc, err)
	}
	if got := strings.Join(listed(), ","); got != "a" {
		t.Fatalf("listed %q, want a", got)
	}

	lose.Store(true)
	_, err = cl.PauseSchedule(ctx, "a")
	lose.Store(false)
	unknown("pause", err)
	if sc, err := cl.PauseSchedule(ctx, "a"); err != nil || !sc.Paused {
		t.Fatalf("the pause sent again: %+v %v, want paused", sc, err)
	}
	if got := strings.Join(listed(), ","); got != "a paused" {
		t.Fatalf("listed %q, want a paused", got)
	}

	lose.Store(true)
	_, err = cl.RemoveSchedule(ctx, "a")
	lose.Store(false)
	unknown("remove", err)
	if !strings.Contains(err.Error(), "may or may not be removed") {
		t.Fatalf("the removal's answer %q does not say it is the removal that is in doubt", err)
	}
	if stored("a") {
		t.Fatal("the removal did not land: the fault is not the one meant")
	}
	if _, err := cl.RemoveSchedule(ctx, "a"); err != nil && !errors.Is(err, client.ErrUnknownSchedule) {
		t.Fatalf("the removal sent again: %v", err)
	}
	if got := listed(); len(got) != 0 {
		t.Fatalf("listed %q after the removal, want none", got)
	}
}

// TestUndoOfAnUnknownPauseHolds: a pause answered "Outcome unknown" whose write landed,
// then a resume: memory, still unpaused, took the resume for nothing to do and answered
// it unpaused without a write; the read-back then took on the pause, so that the queue
// or schedule ended paused, against the last answer. So with a rate limit set that way
// and then removed: the removal was answered Unknown limit, and the limit came into
// force after it. A command answered must hold: once the read-backs end, the queue and
// the schedule are unpaused and the limit gone, in memory and in the store (a resume
// answered "changed meanwhile" is sent again, as it says).
func TestUndoOfAnUnknownPauseHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, cl, lose := startAnswerLosing(t)
	if _, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "q"}, client.Queue("q")); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.AddSchedule(ctx, client.Schedule{Name: "s", Every: time.Hour, TaskType: "SHA256", Payload: map[string]string{"text": "s"}}); err != nil {
		t.Fatal(err)
	}
	lose.Store(true)
	_, qerr := cl.PauseQueue(ctx, "q")
	_, serr := cl.PauseSchedule(ctx, "s")
	_, lerr := cl.SetLimit(ctx, client.ForTaskType("SHA256"), "1/h", 1)
	lose.Store(false)
	if !errors.Is(qerr, client.ErrOutcomeUnknown) || !errors.Is(serr, client.ErrOutcomeUnknown) || !errors.Is(lerr, client.ErrOutcomeUnknown) {
		t.Fatalf("pauses and a limit whose writes landed, their answers lost: %v; %v; %v; want Outcome unknown", qerr, serr, lerr)
	}
	// The limit's removal finds it stored, and removes it.
	if _, err := cl.RemoveLimit(ctx, client.ForTaskType("SHA256")); err != nil {
		t.Fatalf("removal of the limit whose set landed: %v", err)
	}
	resume := func(what string, do func() (bool, error)) {
		for try := 1; ; try++ {
			paused, err := do()
			if err == nil {
				if paused {
					t.Fatalf("resume of %s answered paused", what)
				}
				return
			}
			if try == 3 || !strings.Contains(err.Error(), "changed") {
				t.Fatalf("resume of %s: %v", what, err)
			}
		}
	}
	resume("queue q", func() (bool, error) { q, err := cl.ResumeQueue(ctx, "q"); return q.Paused, err })
	resume("schedule s", func() (bool, error) { sc, err := cl.ResumeSchedule(ctx, "s"); return sc.Paused, err })
	eventuallyTrue(t, "the read-backs over", func() bool {
		c.sched.follows.mu.Lock()
		defer c.sched.follows.mu.Unlock()
		return len(c.sched.follows.reads) == 0
	})
	if qs, err := cl.Queues(ctx); err != nil || len(qs) == 0 || qs[len(qs)-1].Name != "q" || qs[len(qs)-1].Paused {
		t.Errorf("queues after the resume answered: %+v, %v; want q unpaused", qs, err)
	}
	if cur, ok, err := c.store.controls().get(ctx, protocol.QueueControlPrefix+"q"); err != nil || ok && strings.Contains(string(cur.value), `"paused":true`) {
		t.Errorf("queue q stored %s, %v, %v after the resume answered: want it unpaused", cur.value, ok, err)
	}
	if ls, err := cl.Limits(ctx); err != nil || len(ls) != 0 {
		t.Errorf("limits after the removal answered: %+v, %v; want none", ls, err)
	}
	if cur, ok, err := c.store.controls().get(ctx, protocol.LimitControlKey(protocol.LimitTaskType, "SHA256")); err != nil || ok {
		t.Errorf("limit stored %s, %v, %v after the removal answered: want none", cur.value, ok, err)
	}
	if scs, err := cl.Schedules(ctx); err != nil || len(scs) != 1 || scs[0].Paused {
		t.Errorf("schedules after the resume answered: %+v, %v; want s unpaused", scs, err)
	}
	if cur, ok, err := c.store.controls().get(ctx, protocol.SchedulePrefix+"s"); err != nil || !ok || strings.Contains(string(cur.value), `"paused":true`) {
		t.Errorf("schedule s stored %s, %v, %v after the resume answered: want it unpaused", cur.value, ok, err)
	}
}

// TestCommandAfterAnUnknownCreateHolds: a schedule's add, or a new queue's settings,
// answered "Outcome unknown" whose write landed, then a command about it (the
// schedule's removal, the queue's pause): memory, not holding it, answered Unknown
// schedule (queue), and the read-back then took it on: the removed schedule ticked on.
// The command now finds it stored, takes it on and applies to it.
func TestCommandAfterAnUnknownCreateHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, cl, lose := startAnswerLosing(t)
	lose.Store(true)
	_, err := cl.AddSchedule(ctx, client.Schedule{Name: "r", Every: time.Second, TaskType: "SHA256", Payload: map[string]string{"text": "r"}})
	_, qerr := cl.SetQueue(ctx, "fresh", client.MaxRunning(3))
	lose.Store(false)
	if !errors.Is(err, client.ErrOutcomeUnknown) || !errors.Is(qerr, client.ErrOutcomeUnknown) {
		t.Fatalf("add and queue settings whose writes landed, their answers lost: %v; %v; want Outcome unknown", err, qerr)
	}
	if _, err := cl.RemoveSchedule(ctx, "r"); err != nil {
		t.Fatalf("removal of the schedule whose add landed: %v", err)
	}
	if q, err := cl.PauseQueue(ctx, "fresh"); err != nil || !q.Paused || q.MaxRunning != 3 {
		t.Fatalf("pause of the queue whose settings landed: %+v, %v; want paused, max running 3", q, err)
	}
	eventuallyTrue(t, "the read-backs over", func() bool {
		c.sched.follows.mu.Lock()
		defer c.sched.follows.mu.Unlock()
		return len(c.sched.follows.reads) == 0
	})
	if scs, err := cl.Schedules(ctx); err != nil || len(scs) != 0 {
		t.Errorf("schedules after the removal answered: %+v, %v; want none", scs, err)
	}
	if cur, ok, err := c.store.controls().get(ctx, protocol.SchedulePrefix+"r"); err != nil || ok {
		t.Errorf("schedule r stored %s, %v, %v after the removal answered: want none", cur.value, ok, err)
	}
}

// lateLandingStore is a JetStream store whose settings' writes, while held is set,
// do not land yet and lose their answer; a read finds the setting as it was. land then
// stores the last one held, as a cluster's stream leader without a quorum commits a
// write once a follower is back.
type lateLandingStore struct {
	jobStore
	w *lateWrites
}

type lateWrites struct {
	mu    sync.Mutex
	held  bool
	key   string
	value []byte
	rev   uint64
}

func (s lateLandingStore) controls() controlStore {
	return lateControls{s.jobStore.controls(), s.w}
}

type lateControls struct {
	controlStore
	w *lateWrites
}

func (c lateControls) put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	if !c.w.held {
		return c.controlStore.put(ctx, key, value, rev)
	}
	c.w.key, c.w.value, c.w.rev = key, value, rev
	return 0, errAnswerLost
}

// land stores the last write held, as it was sent.
func (w *lateWrites) land(t *testing.T, cs controlStore) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := cs.put(context.Background(), w.key, w.value, w.rev); err != nil {
		t.Fatalf("the late write of %s: %v", w.key, err)
	}
}

// TestAddSentAgainWhileUnknownIsFollowed: a schedule's add answered "Outcome unknown",
// sent again (as the answer says is safe) and answered so again, is taken on once the
// store holds it, though nobody sends it a third time. The second add was made while
// the first's read-back ran, from the same revision (none), so no read-back of its own
// started; and the first's ended at its next read, the name having taken an entry
// (the second add's) since it began: the schedule stored never ran.
func TestAddSentAgainWhileUnknownIsFollowed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, _ := loneServer(t) // diagnose_test.go
	w := new(lateWrites)
	c := &Coordinator{cfg: DefaultConfig()}
	c.cfg.fill()
	js := newJetStreamStore(nc, &c.cfg)
	c.build(nc, lateLandingStore{js, w})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	cl := client.New(nc)

	spec := client.Schedule{Name: "late", Every: time.Hour, TaskType: "SHA256", Payload: map[string]string{"text": "late"}}
	w.mu.Lock()
	w.held = true
	w.mu.Unlock()
	for try := 1; try <= 2; try++ {
		if _, err := cl.AddSchedule(ctx, spec); !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Fatalf("add %d, its write not landed yet: %v; want Outcome unknown", try, err)
		}
	}
	w.land(t, js.controls())
	eventuallyTrue(t, "schedule late listed once stored", func() bool {
		scs, err := cl.Schedules(ctx)
		return err == nil && len(scs) == 1 && scs[0].Name == "late"
	})
}

// TestFollowsCountOnlyWhatIsReadBack: the changes a read-back must notice
// (follows.changes) are counted for the settings read back now, not for every setting
// ever written: queues, limits and schedules set and removed by the score left one
// counter each behind, for the life of the coordinator.
func TestFollowsCountOnlyWhatIsReadBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, cl, lose := startAnswerLosing(t)
	const n = 20
	for i := range n {
		name := fmt.Sprintf("n%d", i)
		if _, err := cl.SetQueue(ctx, name, client.MaxRunning(1)); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.SetQueue(ctx, name, client.MaxRunning(0)); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.SetLimit(ctx, client.ForTaskType(name), "1/h", 1); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.RemoveLimit(ctx, client.ForTaskType(name)); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.AddSchedule(ctx, client.Schedule{Name: name, Every: time.Hour, TaskType: "SHA256", Payload: map[string]string{"text": name}}); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.RemoveSchedule(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	counted := func() []string {
		f := c.sched.follows
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Sorted(maps.Keys(f.changes))
	}
	// A setting whose write is answered "Outcome unknown" is read back, and its
	// changes counted, until the store settles it.
	lose.Store(true)
	_, err := cl.SetQueue(ctx, "q", client.MaxRunning(2))
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		lose.Store(false)
		t.Fatalf("queue settings whose write landed, its answer lost: %v; want Outcome unknown", err)
	}
	got := counted()
	lose.Store(false)
	if want := []string{protocol.QueueControlPrefix + "q"}; !slices.Equal(got, want) {
		t.Errorf("changes counted while queue q is read back: %d keys %q; want %q", len(got), got[:min(len(got), 5)], want)
	}
	eventuallyTrue(t, "the read-back over", func() bool {
		c.sched.follows.mu.Lock()
		defer c.sched.follows.mu.Unlock()
		return len(c.sched.follows.reads) == 0
	})
	qs, err := cl.Queues(ctx)
	if i := slices.IndexFunc(qs, func(q protocol.QueueInfo) bool { return q.Name == "q" }); err != nil || i < 0 || qs[i].MaxRunning != 2 {
		t.Fatalf("queues once q is read back: %+v, %v; want q with max running 2, as stored", qs, err)
	}
	if got := counted(); len(got) != 0 {
		t.Errorf("changes counted once nothing is read back: %d keys %q; want none", len(got), got[:min(len(got), 5)])
	}
}
