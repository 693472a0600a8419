package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
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
