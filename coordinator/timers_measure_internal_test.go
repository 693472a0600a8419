package coordinator

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"
)

// TestMeasureTimerLateness (JOBBUS_MEASURE=1, `task measure-timers`) is the other side
// of TestMeasureNATSMessageSchedules: the same 100,000 due times over 10 s, armed on
// the coordinator's own timers (timers.go) with their driver, each entry noting how
// late its function ran. What it costs a job on top of its record: one heap entry
// (wake, 48 bytes) while it is held whole, none while it is cold (delayed.go).
func TestMeasureTimerLateness(t *testing.T) {
	if os.Getenv("JOBBUS_MEASURE") == "" {
		t.Skip("measurement: set JOBBUS_MEASURE=1 (task measure-timers)")
	}
	const n, window = 100_000, 10 * time.Second
	s := startMem(t, nil, func(c *Config) { c.Now = time.Now })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.sched.timers.run(ctx, time.Second)
	late := make([]time.Duration, 0, n)
	done := make(chan struct{})
	start := time.Now().Add(time.Second)
	s.sched.mu.Lock()
	for i := range n {
		at := start.Add(window * time.Duration(i) / n)
		s.sched.timers.call(at, func(time.Time) {
			late = append(late, time.Since(at))
			if len(late) == n {
				close(done)
			}
		})
	}
	s.sched.mu.Unlock()
	select {
	case <-done:
	case <-time.After(window + time.Minute):
		t.Fatalf("only %d of %d timers fired", len(late), n)
	}
	slices.Sort(late)
	pct := func(p float64) time.Duration { return late[min(n-1, int(p*n))].Round(10 * time.Microsecond) }
	t.Logf("coordinator timers, %d entries due over %v: lateness p50 %v p99 %v max %v", n, window, pct(0.5), pct(0.99), late[n-1].Round(10*time.Microsecond))
}
