package coordinator

import (
	"context"
	"sync"
)

// goroutines are the goroutines of one part of the coordinator (schedules, follows):
// each runs on ctx, and stop ends ctx and waits for them all.
type goroutines struct {
	ctx    context.Context // ends at stop
	cancel context.CancelFunc

	goMu    sync.Mutex // a leaf lock: a goroutine may be started with any other held
	stopped bool
	wg      sync.WaitGroup
}

func newGoroutines() *goroutines {
	ctx, cancel := context.WithCancel(context.Background())
	return &goroutines{ctx: ctx, cancel: cancel}
}

// goRun runs fn on a goroutine stop waits for; it reports false, running nothing, once
// stop has begun.
func (g *goroutines) goRun(fn func()) bool {
	g.goMu.Lock()
	defer g.goMu.Unlock()
	if g.stopped {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		fn()
	}()
	return true
}

// stop ends ctx and waits for every goroutine. It is idempotent.
func (g *goroutines) stop() {
	g.goMu.Lock()
	g.stopped = true
	g.goMu.Unlock()
	g.cancel()
	g.wg.Wait()
}
