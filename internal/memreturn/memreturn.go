// Package memreturn gives the memory a burst of work left behind back to the operating
// system once the process goes quiet.
//
// After a burst (200,000 jobs through serve) Go's heap goal is set by the burst's
// working set, so the runtime keeps the freed heap for reuse: serve held 450-490 MiB
// RSS for two minutes (until the runtime's periodic collection) and 270 MiB after it,
// against a live heap of about 110 MiB. A soft memory limit cannot be derived from
// serve's configuration, since finished jobs are kept for a time, not up to a count, and
// a limit below the live heap makes the collector run continuously; returning the
// memory once the process is idle costs one collection per burst instead.
//
// It is a leaf: it imports nothing of jobbus.
package memreturn

import (
	"cmp"
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Config says when memory is returned. The zero value takes the defaults.
type Config struct {
	// Interval is how often the process's heap is looked at (default 5s): memory is
	// returned within about two intervals of the load ending.
	Interval time.Duration
	// IdleAlloc is what the process may allocate in one interval and still count as
	// idle (default 8 MiB: under load serve allocates hundreds of MiB a second).
	IdleAlloc uint64
	// MinExcess is how much heap memory held beyond the live heap is worth a
	// collection to return (default 64 MiB); it must also be a quarter of the live
	// heap, so a small process is left to the runtime.
	MinExcess uint64
	// Settle is how long after a return, the process idle all along, memory is
	// returned once more (default 10s), and again after each such return that gave
	// back at least MinExcess (at most 3 times): parts of a process drop caches on their own
	// timers once a load ends (the embedded NATS server drops its message blocks'
	// caches 10 s after their last use, over 200 MiB after 200,000 jobs), and what they
	// drop is garbage that only a collection finds, while the first return's
	// collection counted it live.
	Settle time.Duration
	// Logger receives a debug line for each return (default: none).
	Logger *slog.Logger
	// returned, if set, is told of each return (tests).
	returned func(before, after Sample)
	// sample and free stand for the runtime in tests.
	sample func() Sample
	free   func()
}

// Defaults.
const (
	DefaultInterval  = 5 * time.Second
	DefaultIdleAlloc = 8 << 20
	DefaultMinExcess = 64 << 20
	DefaultSettle    = 10 * time.Second
)

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.IdleAlloc == 0 {
		c.IdleAlloc = DefaultIdleAlloc
	}
	if c.MinExcess == 0 {
		c.MinExcess = DefaultMinExcess
	}
	if c.Settle <= 0 {
		c.Settle = DefaultSettle
	}
	if c.sample == nil {
		ms := make([]metrics.Sample, len(sampleNames))
		for i, n := range sampleNames {
			ms[i].Name = n
		}
		c.sample = func() Sample { return read(ms) }
	}
	if c.free == nil {
		c.free = debug.FreeOSMemory
	}
	return c
}

// Sample is what the runtime says of the heap at one moment.
type Sample struct {
	Allocated uint64 // bytes allocated since the process started (cumulative)
	Live      uint64 // the live heap as of the last collection
	Held      uint64 // heap memory backed by physical memory: objects, unused parts of spans, free spans not yet returned
}

// Excess is the heap memory held beyond the live heap: what a collection and a return
// could give back.
func (s Sample) Excess() uint64 {
	if s.Held < s.Live {
		return 0
	}
	return s.Held - s.Live
}

var sampleNames = [...]string{
	"/gc/heap/allocs:bytes",
	"/gc/heap/live:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
}

// read takes a Sample; ms is reused between calls.
func read(ms []metrics.Sample) Sample {
	metrics.Read(ms)
	v := func(i int) uint64 {
		if ms[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return ms[i].Value.Uint64()
	}
	return Sample{Allocated: v(0), Live: v(1), Held: v(2) + v(3) + v(4)}
}

// Due reports whether memory should be returned now, given the sample an interval ago:
// the process allocated less than IdleAlloc since (it is idle), and holds at least
// MinExcess, and a quarter of its live heap, beyond the live heap.
func (c Config) Due(prev, now Sample) bool {
	c.IdleAlloc, c.MinExcess = cmp.Or(c.IdleAlloc, DefaultIdleAlloc), cmp.Or(c.MinExcess, DefaultMinExcess)
	idle := now.Allocated-prev.Allocated < c.IdleAlloc
	excess := now.Excess()
	return idle && excess >= c.MinExcess && excess >= now.Live/4
}

// Start looks at the heap every cfg.Interval and returns memory when it is due, until
// the returned stop is called (stop waits for the goroutine to end; it may be called
// more than once).
func Start(cfg Config) (stop func()) {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		run(ctx, cfg)
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

func run(ctx context.Context, cfg Config) {
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	// settle fires Settle after a return, on its own timer rather than at the next
	// look: the caches it waits for drop about 10 s after the load ends, and a look
	// every Interval would put the second return up to an Interval later.
	settle := time.NewTimer(cfg.Settle)
	settle.Stop()
	defer settle.Stop()
	prev := cfg.sample()
	settles := 0 // settle returns since the last return that was due
	for {
		var settled bool
		select {
		case <-settle.C: // before a look due at the same time, which would take its sample
			settled = true
		default:
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			case <-settle.C:
				settled = true
			}
		}
		now := cfg.sample()
		busy := now.Allocated-prev.Allocated >= cfg.IdleAlloc
		switch {
		case settled && !busy:
			before := now
			now = cfg.give(now)
			// Worth it: once more, for parts that drop their caches later still.
			if settles++; settles < maxSettles && before.Held-min(before.Held, now.Held) >= cfg.MinExcess {
				settle.Reset(cfg.Settle)
			}
		case settled: // busy again: the next return waits for the load to end
		case cfg.Due(prev, now):
			now = cfg.give(now)
			settles = 0
			settle.Reset(cfg.Settle)
		case busy:
			settle.Stop() // a settle return is for a process idle all along
		}
		prev = now
	}
}

// maxSettles bounds the settle returns after one due return: each that gives back at
// least MinExcess is followed by another, Settle later, while the process stays idle.
const maxSettles = 3

// give returns the heap's free memory, now being the sample before, and returns the
// sample after.
func (cfg Config) give(now Sample) Sample {
	start := time.Now()
	cfg.free()
	after := cfg.sample()
	if cfg.Logger != nil {
		cfg.Logger.Debug("returned idle heap memory to the OS", "held_mib", now.Held>>20,
			"held_after_mib", after.Held>>20, "live_mib", after.Live>>20, "took", time.Since(start))
	}
	if cfg.returned != nil {
		cfg.returned(now, after)
	}
	return after
}
