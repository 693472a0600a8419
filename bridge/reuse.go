package bridge

import (
	"context"
	"sync"
	"time"
)

// reusing runs functions on goroutines that wait a moment for the next one before they
// exit. A fresh goroutine starts with a small stack that is copied, larger, as an ask's
// JSON deepens it: a goroutine per TCP worker's result cost 3.6% of a TCP bench's CPU
// in stack copying. The bus reuses its handler goroutines for the same reason.
type reusing struct {
	ctx     context.Context // idle goroutines exit when it ends
	wg      *sync.WaitGroup // owns the goroutines
	handoff chan func()
}

// reuseIdle is how long a goroutine waits for more work.
const reuseIdle = time.Second

func newReusing(ctx context.Context, wg *sync.WaitGroup) *reusing {
	return &reusing{ctx: ctx, wg: wg, handoff: make(chan func())}
}

// run runs fn on an idle goroutine if one waits, else on a new one.
func (r *reusing) run(fn func()) {
	select {
	case r.handoff <- fn:
	default:
		r.wg.Add(1)
		go r.loop(fn)
	}
}

func (r *reusing) loop(fn func()) {
	defer r.wg.Done()
	idle := time.NewTimer(reuseIdle)
	defer idle.Stop()
	for {
		fn()
		idle.Reset(reuseIdle)
		select {
		case fn = <-r.handoff:
		case <-idle.C:
			return
		case <-r.ctx.Done():
			return
		}
	}
}
