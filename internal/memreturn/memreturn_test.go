package memreturn_test

import (
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/internal/memreturn"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const mib = 1 << 20

func TestDue(t *testing.T) {
	c := memreturn.Config{IdleAlloc: 8 * mib, MinExcess: 64 * mib}
	prev := memreturn.Sample{Allocated: 1000 * mib}
	cases := []struct {
		name string
		now  memreturn.Sample
		due  bool
	}{
		{"idle after a burst", memreturn.Sample{Allocated: 1001 * mib, Live: 110 * mib, Held: 450 * mib}, true},
		{"under load", memreturn.Sample{Allocated: 1300 * mib, Live: 110 * mib, Held: 450 * mib}, false},
		{"idle, little to return", memreturn.Sample{Allocated: 1001 * mib, Live: 110 * mib, Held: 150 * mib}, false},
		{"idle, excess below a quarter of a large live heap", memreturn.Sample{Allocated: 1001 * mib, Live: 400 * mib, Held: 480 * mib}, false},
		{"idle, small process", memreturn.Sample{Allocated: 1001 * mib, Live: 5 * mib, Held: 40 * mib}, false},
		{"held below live (between collections)", memreturn.Sample{Allocated: 1001 * mib, Live: 110 * mib, Held: 100 * mib}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.Due(prev, tc.now); got != tc.due {
				t.Fatalf("Due(%+v, %+v) = %v, want %v", prev, tc.now, got, tc.due)
			}
		})
	}
}

// TestReturnsOnceIdle: memory is returned once the load ends, once.
func TestReturnsOnceIdle(t *testing.T) {
	busy := memreturn.Sample{Allocated: 2000 * mib, Live: 150 * mib, Held: 450 * mib}
	idle := memreturn.Sample{Allocated: 2001 * mib, Live: 150 * mib, Held: 450 * mib}
	returned := memreturn.Sample{Allocated: 2001 * mib, Live: 110 * mib, Held: 115 * mib}
	samples := []memreturn.Sample{
		{Allocated: 1000 * mib, Live: 100 * mib, Held: 300 * mib}, // at the start
		busy,
		idle,     // due: free
		returned, // after the return
		returned, // idle, nothing to return
		returned,
	}
	frees := returnsOver(t, memreturn.Config{Interval: time.Millisecond}, samples, func(i int, frees int32) {
		if i == 3 && frees != 1 { // the return read sample 3 after freeing
			t.Fatalf("after an idle sample with 300 MiB beyond the live heap: %d returns, want 1", frees)
		}
	})
	if n := frees; n != 1 {
		t.Fatalf("%d returns, want 1 (after the burst only)", n)
	}
}

// TestReturnsOnceMoreOnceSettled: after a return, a process that stays idle returns
// memory once more after Settle (what caches dropped meanwhile), and then not again
// until a new burst.
func TestReturnsOnceMoreOnceSettled(t *testing.T) {
	busy := memreturn.Sample{Allocated: 2000 * mib, Live: 150 * mib, Held: 450 * mib}
	idle := memreturn.Sample{Allocated: 2001 * mib, Live: 150 * mib, Held: 450 * mib}
	returned := memreturn.Sample{Allocated: 2001 * mib, Live: 140 * mib, Held: 145 * mib}
	samples := []memreturn.Sample{
		{Allocated: 1000 * mib, Live: 100 * mib, Held: 300 * mib}, // at the start
		busy,
		idle,     // due: free (1)
		returned, // after it
		returned, // idle past Settle: free (2)
		returned, // after it
		returned, // idle: nothing more
		returned,
		returned,
	}
	if n := returnsOver(t, memreturn.Config{Interval: time.Millisecond, Settle: time.Nanosecond}, samples, nil); n != 2 {
		t.Fatalf("%d returns, want 2 (after the burst, and once settled)", n)
	}
}

// TestSettleReturnsWhileTheyPay: a settle return that gives back MinExcess or more is
// followed by another, Settle later (some part dropped its caches later still); one
// that gives back less ends them.
func TestSettleReturnsWhileTheyPay(t *testing.T) {
	busy := memreturn.Sample{Allocated: 2000 * mib, Live: 150 * mib, Held: 450 * mib}
	idle := memreturn.Sample{Allocated: 2001 * mib, Live: 150 * mib, Held: 450 * mib}
	first := memreturn.Sample{Allocated: 2001 * mib, Live: 290 * mib, Held: 300 * mib}  // caches still live
	second := memreturn.Sample{Allocated: 2001 * mib, Live: 200 * mib, Held: 210 * mib} // some dropped: 90 MiB back
	third := memreturn.Sample{Allocated: 2001 * mib, Live: 155 * mib, Held: 160 * mib}  // the rest: 50 MiB back
	samples := []memreturn.Sample{
		{Allocated: 1000 * mib, Live: 100 * mib, Held: 300 * mib}, // at the start
		busy,
		idle,   // due: free (1)
		first,  // after it
		first,  // settled: free (2)
		second, // after it: 90 MiB back, so once more
		second, // settled: free (3)
		third,  // after it: 50 MiB back, below MinExcess: no more
		third,
		third,
		third,
	}
	cfg := memreturn.Config{Interval: time.Millisecond, Settle: time.Nanosecond, MinExcess: 64 * mib}
	if n := returnsOver(t, cfg, samples, nil); n != 3 {
		t.Fatalf("%d returns, want 3 (after the burst, once settled, and once more for the 90 MiB the second gave back)", n)
	}
}

// returnsOver runs the goroutine of cfg over samples, one per look, and counts its
// returns; each is called after sample i is taken, with the returns so far.
func returnsOver(t *testing.T, cfg memreturn.Config, samples []memreturn.Sample, each func(i int, frees int32)) int32 {
	t.Helper()
	feed, done := make(chan memreturn.Sample), make(chan struct{})
	var frees, reads atomic.Int32
	sample := func() memreturn.Sample {
		reads.Add(1)
		select {
		case s := <-feed:
			return s
		case <-done:
			return memreturn.Sample{}
		}
	}
	stop := memreturn.Start(memreturn.WithRuntime(cfg, sample, func() { frees.Add(1) }))
	for i, s := range samples {
		feed <- s
		if each != nil {
			each(i, frees.Load())
		}
	}
	// The goroutine asks for the next sample only once it acted on the last.
	deadline := time.Now().Add(10 * time.Second)
	for reads.Load() <= int32(len(samples)) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(done)
	stop()
	return frees.Load()
}

var sink [][]byte

// TestReturnsAfterBurst: with the real runtime, a return leaves little beyond the live
// heap (the test's own config makes every look a return).
func TestReturnsAfterBurst(t *testing.T) {
	type ret struct{ before, after memreturn.Sample }
	returns := make(chan ret, 1)
	cfg := memreturn.WithReturned(memreturn.Config{Interval: 10 * time.Millisecond, IdleAlloc: 1 << 62, MinExcess: 1},
		func(before, after memreturn.Sample) {
			select {
			case returns <- ret{before, after}:
			default:
			}
		})
	// A collection during the burst would take the burst as live heap (Due would then
	// see no excess until the next collection, minutes later with nothing allocating),
	// and one after it would leave the scavenger to return the burst on its own: so the
	// burst is made with the collector off, after one collection gives Live a value.
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for range 96 { // the burst: 96 MiB, all garbage once sink is dropped
		b := make([]byte, mib)
		b[0] = 1
		sink = append(sink, b)
	}
	sink = nil
	stop := memreturn.Start(cfg)
	defer stop()
	select {
	case r := <-returns:
		if r.before.Allocated < 96*mib || r.before.Held == 0 || r.before.Live == 0 {
			t.Fatalf("implausible sample before the return: %+v", r.before)
		}
		if r.after.Held >= 48*mib || r.after.Excess() >= 16*mib {
			t.Fatalf("after the return the heap holds %d MiB (live %d MiB): the burst was not returned",
				r.after.Held>>20, r.after.Live>>20)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no return within 30s")
	}
	stop()
	stop() // a second stop is harmless
}
