package coordinator

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// The timer driver wakes at the earliest entry, not at the next sweep: with a sweep an
// hour away, a retry's backoff of a few milliseconds still ends on time.
func TestTimersWakeWithoutTheSweep(t *testing.T) {
	s := startMem(t, nil, func(c *Config) {
		c.Now = time.Now
		c.SweepInterval = time.Hour
		c.RetryBaseDelay, c.RetryMaxDelay = 20*time.Millisecond, 20*time.Millisecond
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.sched.timers.run(ctx, time.Hour) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	s.register("w1", 1)
	id := s.accepted(sha("x"))
	first := s.assigned("w1")
	if ack, err := s.result("w1", first, false, false, "boom"); err != nil || !ack.Accepted {
		t.Fatalf("failure of attempt 1: %+v, %v", ack, err)
	}
	second := s.assigned("w1") // waits up to 10 s; the sweep never runs
	if second.JobID != id || second.AttemptNumber != 2 {
		t.Fatalf("assigned %s attempt %d, want %s attempt 2", second.JobID, second.AttemptNumber, id)
	}
}

// Entries fire in time order (arming order among equals), only once due, and a job's
// entry is skipped once the job no longer waits for that time.
func TestTimersFireInOrderAndSkipStaleJobs(t *testing.T) {
	s := startMem(t, nil)
	sc := s.sched
	base := s.clock.Now()
	var fired []string
	note := func(name string) func(time.Time) { return func(time.Time) { fired = append(fired, name) } }

	sc.mu.Lock()
	sc.timers.call(base.Add(2*time.Second), note("c"))
	sc.timers.call(base.Add(time.Second), note("a"))
	sc.timers.call(base.Add(time.Second), note("b"))
	stale := &job{rec: protocol.Record{JobID: "stale", State: protocol.StateRetryWait, RetryAt: base.Add(3 * time.Second).UnixMilli()}}
	sc.timers.wakeJob(stale, base.Add(time.Second)) // armed for an earlier backoff
	sc.timers.fire(base.Add(500 * time.Millisecond))
	if len(fired) != 0 {
		t.Fatalf("fired %v before anything was due", fired)
	}
	sc.timers.fire(base.Add(2 * time.Second))
	sc.mu.Unlock()
	want := []string{"a", "b", "c"}
	if !slices.Equal(fired, want) {
		t.Fatalf("fired %v, want %v", fired, want)
	}
	if stale.rec.State != protocol.StateRetryWait {
		t.Fatalf("a stale entry moved its job to %s", stale.rec.State)
	}
	if at, ok := sc.timers.next(); ok {
		t.Fatalf("an entry is left, due %v", at)
	}
}
