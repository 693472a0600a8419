package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrNotDurable means job writes JetStream stored could not be made durable
// (Config.SyncJobs failed): they wait, unanswered, and submissions are refused with
// the cause until a sync succeeds.
var ErrNotDurable = errors.New("coordinator: job writes not made durable")

// A groupSync holds writes JetStream has acknowledged until Config.SyncJobs has made
// them durable, and only then records them (written), which answers their waiters and
// lets each job's next write go. Writes acknowledged while one sync runs wait for the
// next: under load one fsync covers many writes (group commit), while a lone write
// waits for one fsync only.
type groupSync struct {
	sync func() error
	wake chan struct{}

	mu    sync.Mutex
	acked []ackedWrite
}

// ackedWrite is a write JetStream stored, awaiting durability.
type ackedWrite struct {
	j            *job
	rev, version uint64
}

func newGroupSync(sync func() error) *groupSync {
	if sync == nil {
		return nil
	}
	return &groupSync{sync: sync, wake: make(chan struct{}, 1)}
}

// stored records a write JetStream acknowledged at revision rev: at once, or once it
// is durable when the coordinator syncs the store itself.
func (c *Coordinator) stored(j *job, rev, version uint64) {
	g := c.durable
	if g == nil {
		c.written(j, rev, version)
		return
	}
	g.mu.Lock()
	g.acked = append(g.acked, ackedWrite{j, rev, version})
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// syncer makes acknowledged writes durable, a group at a time, until ctx ends; writes
// still waiting then fail with ctx's error. Another goroutine records each group
// synced (written: answering its waiters, queueing its jobs' next writes) while the
// next fsync runs, so that the fsyncs follow one another as closely as the disk allows.
func (c *Coordinator) syncer(ctx context.Context) {
	g := c.durable
	synced := make(chan []ackedWrite, 4)
	defer close(synced)
	c.goRun(func() {
		for ws := range synced {
			for _, w := range ws {
				c.written(w.j, w.rev, w.version)
			}
		}
	})
	for {
		select {
		case <-ctx.Done():
			c.failAll(g.take(), ctx.Err())
			return
		case <-g.wake:
		}
		ws := g.take()
		if len(ws) == 0 {
			continue
		}
		for err := c.syncGroup(len(ws)); err != nil; err = c.syncGroup(len(ws)) {
			// Never answered for: the writes wait, the store counts as failing (new
			// submissions are refused with the cause), and the sync is tried again.
			c.notDurable(err)
			select {
			case <-ctx.Done():
				c.failAll(append(ws, g.take()...), ctx.Err())
				return
			case <-time.After(storeProbeEvery):
			}
			ws = append(ws, g.take()...)
		}
		c.storage.synced()
		synced <- ws
	}
}

// syncGroup makes a group of n writes durable, and tells the observer.
func (c *Coordinator) syncGroup(n int) error {
	start := time.Now()
	err := c.durable.sync()
	if obs := c.cfg.Observer; obs != nil {
		if err != nil {
			n = 0
		}
		obs.Synced(time.Since(start), n, err)
	}
	return err
}

// failAll ends the waiters of writes JetStream stored but the coordinator could not
// sync before it stopped: stored, not known durable, so their outcome is unknown.
func (c *Coordinator) failAll(ws []ackedWrite, err error) {
	for _, w := range ws {
		c.fail(w.j, unknownOutcome(fmt.Errorf("stored, not yet synced to disk when the coordinator stopped: %w", err)))
	}
}

// take removes the writes waiting for a sync.
func (g *groupSync) take() []ackedWrite {
	g.mu.Lock()
	defer g.mu.Unlock()
	ws := g.acked
	g.acked = nil
	return ws
}

// notDurable notes a failed sync: the store is failing with err until a sync succeeds.
func (c *Coordinator) notDurable(err error) {
	err = fmt.Errorf("%w: %w", ErrNotDurable, err)
	if c.storage.unsynced.Swap(&err) == nil {
		c.log.Error("job writes not made durable: they wait, and new submissions are refused, until the store syncs again", "err", err)
	}
}
