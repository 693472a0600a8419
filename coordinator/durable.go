package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ErrNotDurable means job writes JetStream stored could not be made durable
// (Config.SyncJobs failed): they wait, unanswered, and submissions are refused with
// the cause until a sync succeeds.
var ErrNotDurable = errors.New("coordinator: job writes not made durable")

// A syncedStore is a jobStore whose writes count only once Config.SyncJobs has made
// them durable: it holds the writes the store under it acknowledged and records them
// (written) only after a sync that began after their acknowledgement, which answers
// their waiters and lets each job's next write go. Writes acknowledged while one sync
// runs wait for the next: under load one fsync covers many writes (group commit),
// while a lone write waits for one fsync only. It owns the acknowledged writes and the
// goroutines that sync them and record them.
type syncedStore struct {
	jobStore  // what it writes through
	storeSink // what it tells, once durable
	sync      func() error
	obs       Observer
	log       *slog.Logger
	wake      chan struct{}
	wg        sync.WaitGroup

	mu    sync.Mutex
	acked []ackedWrite
}

// ackedWrite is a write JetStream stored, awaiting durability.
type ackedWrite struct {
	j            *job
	rev, version uint64
}

// newSyncedStore makes the writes of inner durable with sync.
func newSyncedStore(inner jobStore, sync func() error, cfg *Config) *syncedStore {
	return &syncedStore{jobStore: inner, sync: sync, obs: cfg.Observer, log: cfg.Logger, wake: make(chan struct{}, 1)}
}

// start starts the store under it, which reports to g, and the syncer.
func (g *syncedStore) start(ctx context.Context, sink storeSink) error {
	g.storeSink = sink
	if err := g.jobStore.start(ctx, g); err != nil {
		return err
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.syncer(ctx)
	}()
	return nil
}

func (g *syncedStore) wait() {
	g.jobStore.wait()
	g.wg.Wait()
}

// written holds a write the store under it acknowledged at revision rev until it is
// durable.
func (g *syncedStore) written(j *job, rev, version uint64) {
	g.writtenAll([]ackedWrite{{j, rev, version}})
}

// writtenAll holds writes the store under it acknowledged until they are durable.
func (g *syncedStore) writtenAll(ws []ackedWrite) {
	g.mu.Lock()
	g.acked = append(g.acked, ws...)
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
func (g *syncedStore) syncer(ctx context.Context) {
	synced := make(chan []ackedWrite, 4)
	defer close(synced)
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for ws := range synced {
			g.storeSink.writtenAll(ws)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			g.failAll(g.take(), ctx.Err())
			return
		case <-g.wake:
		}
		ws := g.take()
		if len(ws) == 0 {
			continue
		}
		for err := g.syncGroup(len(ws)); err != nil; err = g.syncGroup(len(ws)) {
			// Never answered for: the writes wait, the store counts as failing (new
			// submissions are refused with the cause), and the sync is tried again.
			g.notDurable(err)
			select {
			case <-ctx.Done():
				g.failAll(append(ws, g.take()...), ctx.Err())
				return
			case <-time.After(storeProbeEvery):
			}
			ws = append(ws, g.take()...)
		}
		g.health().synced()
		synced <- ws
	}
}

// syncGroup makes a group of n writes durable, and tells the observer.
func (g *syncedStore) syncGroup(n int) error {
	start := time.Now()
	err := g.sync()
	if g.obs != nil {
		if err != nil {
			n = 0
		}
		g.obs.Synced(time.Since(start), n, err)
	}
	return err
}

// failAll ends the waiters of writes JetStream stored but the coordinator could not
// sync before it stopped: stored, not known durable, so their outcome is unknown.
func (g *syncedStore) failAll(ws []ackedWrite, err error) {
	for _, w := range ws {
		g.storeSink.fail(w.j, unknownOutcome(fmt.Errorf("stored, not yet synced to disk when the coordinator stopped: %w", err)))
	}
}

// take removes the writes waiting for a sync.
func (g *syncedStore) take() []ackedWrite {
	g.mu.Lock()
	defer g.mu.Unlock()
	ws := g.acked
	g.acked = nil
	return ws
}

// notDurable notes a failed sync: the store is failing with err until a sync succeeds.
func (g *syncedStore) notDurable(err error) {
	err = fmt.Errorf("%w: %w", ErrNotDurable, err)
	if g.health().unsynced.Swap(&err) == nil {
		g.log.Error("job writes not made durable: they wait, and new submissions are refused, until the store syncs again", "err", err)
	}
}
