package cli_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// TestAnsweredSettingsSurviveServeSIGKILL: jobbus serve SIGKILLed the moment its last
// answer came, after a schedule was added, one paused, one removed, a queue paused with
// a job waiting, a queue's max running set, a limit set and another removed. Started
// again on its store, it holds each change as it was answered: the schedule added last
// ticks, every tick since its creation one job (catch-up all, so the ticks the
// downtime took too); the paused and the removed schedules submit nothing after their
// answer; the paused queue holds its job while another queue's runs; the limits and
// queue settings are those answered.
func TestAnsweredSettingsSurviveServeSIGKILL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, url := serveProc(t, dir) // no worker: the held job waits however the pause goes
	cl := client.New(natsConnect(t, url), client.WithTimeout(10*time.Second))
	ctx := context.Background()
	every := func(name string) client.Schedule {
		return client.Schedule{Name: name, Every: time.Second, CatchUp: protocol.CatchUpAll, TaskType: "SHA256",
			Payload: map[string]string{"text": name}}
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for _, name := range []string{"paused", "removed"} {
		_, err := cl.AddSchedule(ctx, every(name))
		must("add schedule "+name, err)
	}
	_, err := cl.PauseSchedule(ctx, "paused")
	must("pause schedule", err)
	pausedAt := time.Now().UnixMilli()
	_, err = cl.RemoveSchedule(ctx, "removed")
	must("remove schedule", err)
	removedAt := time.Now().UnixMilli()
	held, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "held"}, client.Queue("held"))
	must("submit to held", err)
	_, err = cl.PauseQueue(ctx, "held")
	must("pause queue", err)
	_, err = cl.SetQueue(ctx, "capped", client.MaxRunning(1))
	must("set queue", err)
	_, err = cl.SetLimit(ctx, client.ForTaskType("WORD_COUNT"), "1/h", 1)
	must("set limit", err)
	_, err = cl.RemoveLimit(ctx, client.ForTaskType("WORD_COUNT"))
	must("remove limit", err)
	_, err = cl.SetLimit(ctx, client.ForQueue("slow"), "5/m", 2)
	must("set limit", err)
	added, err := cl.AddSchedule(ctx, every("ticks"))
	must("add schedule ticks", err)
	p.signal(syscall.SIGKILL) // at once: nothing answered may be waiting for a write
	p.wait()
	killed := time.Now()

	_, url = serveProc(t, dir, "--workers", "1")
	nc := natsConnect(t, url)
	cl = client.New(nc, client.WithTimeout(10*time.Second))
	scs, err := cl.Schedules(ctx)
	must("list schedules", err)
	names := make([]string, 0, len(scs))
	for _, sc := range scs {
		names = append(names, sc.Name)
		if sc.Paused != (sc.Name == "paused") {
			t.Errorf("schedule %s paused %t after the kill", sc.Name, sc.Paused)
		}
	}
	if !slices.Equal(names, []string{"paused", "ticks"}) {
		t.Fatalf("schedules after the kill: %v, want paused and ticks", names)
	}
	qs, err := cl.Queues(ctx)
	must("list queues", err)
	var heldQ, capped protocol.QueueInfo
	for _, q := range qs {
		switch q.Name {
		case "held":
			heldQ = q
		case "capped":
			capped = q
		}
	}
	if !heldQ.Paused || heldQ.Queued != 1 || capped.MaxRunning != 1 {
		t.Fatalf("queues after the kill: held %+v, capped %+v; want held paused with its job, capped at 1", heldQ, capped)
	}
	limits, err := cl.Limits(ctx)
	must("list limits", err)
	if len(limits) != 1 || limits[0].Scope != protocol.LimitQueue || limits[0].Name != "slow" || limits[0].Rate != "5/m" || limits[0].Burst != 2 {
		t.Fatalf("limits after the kill: %+v, want queue slow's 5/m burst 2 only", limits)
	}

	// Ticks after the restart, then a look at every tick each schedule made.
	eventually(t, "two ticks of the new schedule after the restart", func() bool {
		scs, err := cl.Schedules(ctx)
		return err == nil && slices.ContainsFunc(scs, func(sc protocol.Schedule) bool {
			return sc.Name == "ticks" && sc.LastTickMillis > killed.UnixMilli()+1000
		})
	})
	sc, err := cl.PauseSchedule(ctx, "ticks")
	must("pause ticks", err)
	ticks := map[string][]int64{}
	for _, r := range storedRecords(t, nc) {
		if r.Schedule == "" {
			continue
		}
		at, err := strconv.ParseInt(r.IdempotencyKey[strings.LastIndexByte(r.IdempotencyKey, ':')+1:], 10, 64)
		if err != nil || r.IdempotencyKey != protocol.ScheduleTickKey(r.Schedule, at) {
			t.Fatalf("job %s of schedule %s under key %q, not a tick's", r.JobID, r.Schedule, r.IdempotencyKey)
		}
		ticks[r.Schedule] = append(ticks[r.Schedule], at)
	}
	for name, since := range map[string]int64{"paused": pausedAt, "removed": removedAt} {
		for _, at := range ticks[name] {
			if at > since {
				t.Errorf("schedule %s ticked at %d, after it was answered paused or removed at %d", name, at, since)
			}
		}
	}
	got := ticks["ticks"]
	slices.Sort(got)
	var want []int64
	for at := added.CreatedAtMillis + 1000; at <= sc.LastTickMillis; at += 1000 {
		want = append(want, at)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the new schedule's jobs are of ticks %v; want one for each tick %v", got, want)
	}
	if j, err := cl.Status(ctx, held); err != nil || j.State != protocol.StateQueued {
		t.Fatalf("the paused queue's job: %+v %v, want QUEUED", j, err)
	}
	t.Logf("%d ticks of a schedule added just before the kill, %d while serve was down; one job each", len(got), int64(len(got))-(sc.LastTickMillis-killed.UnixMilli())/1000)
}
