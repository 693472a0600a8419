package coordinator

import (
	"context"
	"time"
)

// sweeper runs the scheduler's sweep every SweepInterval until its context ends: due
// retries go back to the queue, overrun attempts are revoked, silent workers lost and
// finished jobs forgotten once their retention ended (scheduler.sweep). It owns its
// ticker; the coordinator owns its goroutine.
type sweeper struct {
	every time.Duration
	sweep func()
}

func (w sweeper) run(ctx context.Context) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.sweep()
		}
	}
}
