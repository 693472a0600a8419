package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// JobEventType says what a JobEvent reports.
type JobEventType int

const (
	// JobChanged: a job appeared, or what a user sees of it changed: its state, its
	// attempts or its worker.
	JobChanged JobEventType = iota + 1
	// JobRemoved: a job's record left the bucket: it expired after its retention, or
	// was deleted. Only a native watch reports removals; polling forgets a job the list
	// no longer holds without an event.
	JobRemoved
)

func (t JobEventType) String() string {
	switch t {
	case JobChanged:
		return "changed"
	case JobRemoved:
		return "removed"
	}
	return fmt.Sprintf("JobEventType(%d)", int(t))
}

// JobEvent is one change Watch saw.
type JobEvent struct {
	Type JobEventType
	// Job is the job's snapshot as Status returns it; for JobRemoved only JobID is set.
	Job protocol.Job
	// At is when the change was stored (natively) or seen (polling).
	At time.Time
	// Err is set on the last event, and only there, when the watch failed rather than
	// ended with its context.
	Err error
}

// WatchOption configures Watch.
type WatchOption func(*watchOptions)

type watchOptions struct {
	interval time.Duration
	giveUp   time.Duration
}

// WatchPollInterval is how often a watch that polls lists the jobs (default 1s).
// A native watch does not poll.
func WatchPollInterval(d time.Duration) WatchOption {
	return func(o *watchOptions) { o.interval = d }
}

// WatchGiveUpAfter makes a watch that polls (over DialTCP) fail once its polls have
// found no bridge at its address (nothing answered there: ErrNoCoordinator) for d, so
// a bridge that is gone ends it as a NATS connection whose reconnects ran out ends a
// native watch. A bridge that answers, even without a coordinator behind it, keeps the
// watch going. 0, the default, polls until ctx ends, whenever the bridge comes back.
func WatchGiveUpAfter(d time.Duration) WatchOption {
	return func(o *watchOptions) { o.giveUp = d }
}

// Watch reports the changes of every job from now on, until ctx ends or the watch
// fails (its last event then carries Err); then the channel closes. When Watch
// returns, the watch is in place: a change made afterwards is seen.
//
// On a NATS connection (New) it follows the coordinator's job records in the JOBS
// bucket of JetStream KV (protocol.JobsBucket, schema protocol.Record); over any other
// transport (DialTCP) it lists the jobs every WatchPollInterval. Either way an event
// comes only when what a user sees of a job changed (its state, attempts or worker):
// a record rewritten for another reason, or a poll that finds nothing new, reports
// nothing. A poll sees only the states a job is in when it looks, so a quick job may
// go from QUEUED to COMPLETED in one event. A poll that fails is tried again at the
// next interval (a bridge or coordinator restarting); a watch that polls fails only
// once its client is closed (ErrClosed), or its bridge stayed away for
// WatchGiveUpAfter.
//
// The caller must receive until the channel closes or cancel ctx.
func (c *Client) Watch(ctx context.Context, opts ...WatchOption) (<-chan JobEvent, error) {
	o := watchOptions{interval: time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if o.interval <= 0 {
		return nil, fmt.Errorf("watch jobs: poll interval must be positive, got %v", o.interval)
	}
	var (
		run func(context.Context, chan<- JobEvent)
		err error
	)
	if n, ok := c.tr.(*natsTransport); ok {
		run, err = watchBucket(ctx, n.nc)
	} else {
		run, err = c.pollJobs(ctx, o.interval, o.giveUp)
	}
	if err != nil {
		return nil, err
	}
	events := make(chan JobEvent)
	go func() {
		defer close(events)
		run(ctx, events)
	}()
	return events, nil
}

// send hands ev on unless ctx ends first.
func send(ctx context.Context, events chan<- JobEvent, ev JobEvent) bool {
	select {
	case events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// jobTracker passes on a job only when what a user sees of it changed: its state,
// attempts or worker.
type jobTracker map[string]string

func (t jobTracker) changed(j protocol.Job) bool {
	w := "-"
	if j.WorkerID != nil {
		w = *j.WorkerID
	}
	key := fmt.Sprintf("%s/%d/%s", j.State, j.Attempts, w)
	if t[j.JobID] == key {
		return false
	}
	t[j.JobID] = key
	return true
}

// update takes a whole job list (newest first, as List pages it) and returns the jobs
// that changed, oldest first. It forgets the jobs the list no longer holds (expired
// after their retention), so a long watch does not grow without end.
func (t jobTracker) update(jobs []protocol.Job) []protocol.Job {
	var changed []protocol.Job
	listed := make(map[string]bool, len(jobs))
	for _, j := range slices.Backward(jobs) {
		listed[j.JobID] = true
		if t.changed(j) {
			changed = append(changed, j)
		}
	}
	maps.DeleteFunc(t, func(id, _ string) bool { return !listed[id] })
	return changed
}

// watchBucket watches the JOBS bucket for updates.
func watchBucket(ctx context.Context, nc *nats.Conn) (func(context.Context, chan<- JobEvent), error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("watch jobs: %w", err)
	}
	kv, err := js.KeyValue(ctx, protocol.JobsBucket)
	if err != nil {
		// ErrBucketNotFound: no coordinator has run on this NATS.
		return nil, fmt.Errorf("watch jobs: open bucket %s: %w", protocol.JobsBucket, causeOf(ctx, err))
	}
	// The bucket's last revision before the watch: nats.go's ordered consumer, reset
	// (after a reconnect, say a server restart) before it delivered anything, starts
	// again from the stream's first message, and what it replays did not change now.
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch jobs: bucket %s: %w", protocol.JobsBucket, causeOf(ctx, err))
	}
	var before uint64
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		before = bs.StreamInfo().State.LastSeq
	}
	w, err := kv.Watch(ctx, "*", jetstream.UpdatesOnly()) // records only (protocol.IsRecordKey)
	if err != nil {
		return nil, fmt.Errorf("watch jobs: watch bucket %s: %w", protocol.JobsBucket, causeOf(ctx, err))
	}
	return func(ctx context.Context, events chan<- JobEvent) {
		defer func() { _ = w.Stop() }()
		seen := jobTracker{}
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					if ctx.Err() == nil {
						send(ctx, events, JobEvent{Err: fmt.Errorf("watch jobs: watch of bucket %s ended", protocol.JobsBucket)})
					}
					return
				}
				if e != nil && e.Revision() <= before {
					continue
				}
				if ev, ok := entryEvent(e, seen); ok && !send(ctx, events, ev) {
					return
				}
			}
		}
	}, nil
}

// entryEvent turns a KV entry (nil marks the end of the initial values) into an event.
func entryEvent(e jetstream.KeyValueEntry, seen jobTracker) (JobEvent, bool) {
	if e == nil {
		return JobEvent{}, false
	}
	if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
		delete(seen, e.Key())
		return JobEvent{Type: JobRemoved, Job: protocol.Job{JobID: e.Key()}, At: e.Created()}, true
	}
	j, err := recordSnapshot(e.Value())
	if err != nil || !seen.changed(j) {
		return JobEvent{}, false
	}
	return JobEvent{Type: JobChanged, Job: j, At: e.Created()}, true
}

// recordSnapshot decodes a job record of the JOBS bucket (protocol.Record, the schema
// the coordinator publishes) into the snapshot Status shows.
func recordSnapshot(data []byte) (protocol.Job, error) {
	var r protocol.Record
	if err := json.Unmarshal(data, &r); err != nil {
		return protocol.Job{}, err
	}
	return r.Snapshot(), nil
}

// pollJobs lists every job each interval and passes on the changes; the first list,
// taken now, is the baseline and reports nothing. It fails once its polls found no
// bridge for giveUp (0: never).
func (c *Client) pollJobs(ctx context.Context, interval, giveUp time.Duration) (func(context.Context, chan<- JobEvent), error) {
	seen := jobTracker{}
	jobs, err := c.allJobs(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch jobs: %w", err)
	}
	seen.update(jobs)
	return func(ctx context.Context, events chan<- JobEvent) {
		t := time.NewTicker(interval)
		defer t.Stop()
		var away time.Time // the first of the polls in a row that found no bridge
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			jobs, err := c.allJobs(ctx)
			var nobody *noBridgeError
			switch {
			case errors.Is(err, ErrClosed): // no poll can succeed any more
				send(ctx, events, JobEvent{Err: fmt.Errorf("watch jobs: %w", err)})
				return
			case errors.As(err, &nobody) && giveUp > 0:
				if away.IsZero() {
					away = time.Now()
				} else if time.Since(away) >= giveUp {
					send(ctx, events, JobEvent{Err: fmt.Errorf("watch jobs: gave up after %v without a bridge: %w", giveUp, err)})
					return
				}
				continue // a bridge restarting; the next poll tells
			case err != nil:
				away = time.Time{}
				continue // a coordinator restarting; the next poll tells
			}
			away = time.Time{}
			now := time.Now()
			for _, j := range seen.update(jobs) {
				if !send(ctx, events, JobEvent{Type: JobChanged, Job: j, At: now}) {
					return
				}
			}
		}
	}, nil
}

// allJobs pages through the whole job list, newest first.
func (c *Client) allJobs(ctx context.Context) ([]protocol.Job, error) {
	req := protocol.ListJobs{Limit: 1000}
	var jobs []protocol.Job
	for {
		page, err := c.List(ctx, req)
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, page.Jobs...)
		if page.NextCursor == "" {
			return jobs, nil
		}
		req.Cursor = page.NextCursor
	}
}
