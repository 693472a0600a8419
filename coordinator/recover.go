package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// recover rebuilds memory from KV before anything is served: jobs, queue, sequence,
// admission count and idempotency bindings. A RUNNING job's attempt was lost with the
// previous coordinator: it counts, and the job runs again or, if that was its last
// attempt, fails.
func (c *Coordinator) recover(ctx context.Context) error {
	recs, err := loadAll(ctx, c.jobsKV)
	if err != nil {
		return fmt.Errorf("load %s: %w", protocol.JobsBucket, err)
	}
	c.mu.Lock()
	for _, e := range recs {
		var r protocol.Record
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			c.log.Warn("skipping unreadable job record", "key", e.Key(), "err", err)
			continue
		}
		c.restore(r, e.Revision())
	}
	slices.SortFunc(c.order, func(a, b *job) int { return compareSeq(a.rec.Seq, b.rec.Seq) })
	c.unlock()
	return c.repairBindings(ctx)
}

func compareSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// restore adds one stored job to memory. Called with c.mu held.
func (c *Coordinator) restore(r protocol.Record, rev uint64) {
	j := &job{rec: r, rev: rev, seen: r.State}
	c.jobs[r.JobID] = j
	c.order = append(c.order, j)
	c.seq = max(c.seq, r.Seq)
	c.lastMilli = max(c.lastMilli, r.CreatedAt)
	if r.IdempotencyKey != "" {
		c.keys[r.IdempotencyKey] = j
	}
	if r.State.Active() {
		c.active++
	}
	switch r.State {
	case protocol.StateQueued:
		c.ready.push(j)
	case protocol.StateRetryWait:
		c.pushRetry(j)
	case protocol.StateRunning:
		j.rec.WorkerID, j.rec.AttemptID = "", ""
		if r.Attempts >= r.MaxAttempts {
			j.rec.State = protocol.StateFailed
			j.rec.Error = ptr("coordinator restarted during final attempt; outcome unknown")
			c.active--
		} else {
			j.rec.State = protocol.StateQueued
			c.ready.push(j)
		}
		c.markDirty(j, nil)
	}
}

// repairBindings makes JOB_KEYS agree with the job records, which are the truth: a
// binding whose job was never stored (a crash between the two writes) is removed.
func (c *Coordinator) repairBindings(ctx context.Context) error {
	entries, err := loadAll(ctx, c.keysKV)
	if err != nil {
		return fmt.Errorf("load %s: %w", protocol.KeysBucket, err)
	}
	for _, e := range entries {
		var b binding
		_ = json.Unmarshal(e.Value(), &b)
		c.mu.Lock()
		_, known := c.jobs[b.JobID]
		c.unlock()
		if known {
			continue
		}
		if err := c.keysKV.Delete(ctx, e.Key(), jetstream.LastRevision(e.Revision())); err != nil {
			return fmt.Errorf("remove orphan binding %s: %w", e.Key(), err)
		}
	}
	return nil
}

// loadAll reads every current entry of a bucket.
func loadAll(ctx context.Context, kv jetstream.KeyValue) ([]jetstream.KeyValueEntry, error) {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	var out []jetstream.KeyValueEntry
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("watch closed before the initial values were read")
			}
			if e == nil {
				return out, nil
			}
			out = append(out, e)
		}
	}
}
