package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

func watchCommand() *cli.Command {
	return &cli.Command{
		Name:  "watch",
		Usage: "print job and worker changes as they happen, until Ctrl-C",
		Description: `Prints a line for every job state change and every worker that joins or leaves.
Natively it follows the coordinator's job records in JetStream KV (bucket JOBS); over
--connect it polls the job list. Workers are polled either way.
With --json each line is {"event":"job"|"job_removed"|"worker_joined"|"worker_left","atMillis":...,
"job":{...}|"jobId":"..."|"worker":{...}}.

Example:
   jobbus watch --json | jq -c 'select(.event=="job" and .job.state=="FAILED")'`,
		Flags: []cli.Flag{
			&cli.Int64Flag{Name: "interval-millis", Value: 1000, Usage: "how often workers (and over --connect, jobs) are polled", EnvVars: env("interval-millis")},
			jsonFlag(),
		},
		Action: watch,
	}
}

// watchEvent is one line of watch.
type watchEvent struct {
	Event    string           `json:"event"`
	AtMillis int64            `json:"atMillis"`
	Job      *protocol.Job    `json:"job,omitempty"`
	JobID    string           `json:"jobId,omitempty"`
	Worker   *protocol.Worker `json:"worker,omitempty"`
	err      error
}

func watch(c *cli.Context) error {
	if _, err := args(c); err != nil {
		return err
	}
	interval := time.Duration(c.Int64("interval-millis")) * time.Millisecond
	if interval <= 0 {
		return usageError("--interval-millis must be positive, got %d", c.Int64("interval-millis"))
	}
	s, err := connect(c, true)
	if err != nil {
		return exitErr(err)
	}
	defer s.Close()
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	events := make(chan watchEvent)
	jobs, err := jobSource(ctx, s, interval)
	if err != nil {
		return exitErr(err)
	}
	workers, err := workerSource(ctx, s, interval)
	if err != nil {
		return exitErr(err)
	}
	var wg sync.WaitGroup
	for _, src := range []func(context.Context, chan<- watchEvent){jobs, workers} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src(ctx, events)
		}()
	}
	defer wg.Wait() // after cancel, so the sources stop
	defer cancel()

	// On stderr once the watch is in place: changes from here on are shown.
	fmt.Fprintf(c.App.ErrWriter, "watching jobs and workers on %s (Ctrl-C to stop)\n", s.target)
	p := newPrinter(c.App.Writer, c.Bool("json"))
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-events:
			if ev.err != nil {
				return exitErr(ev.err)
			}
			if err := p.watchEvent(ev); err != nil {
				return err
			}
		}
	}
}

// emit hands an event to the printing loop unless ctx ends first.
func emit(ctx context.Context, events chan<- watchEvent, ev watchEvent) bool {
	if ev.AtMillis == 0 {
		ev.AtMillis = time.Now().UnixMilli()
	}
	select {
	case events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// jobTracker passes on a job only when what watch shows of it changed: its state,
// attempts or worker. Records rewritten for other reasons, and polls that find
// nothing new, print nothing.
type jobTracker map[string]string

func (t jobTracker) changed(j protocol.Job) bool {
	key := fmt.Sprintf("%s/%d/%s", j.State, j.Attempts, orDash(j.WorkerID))
	if t[j.JobID] == key {
		return false
	}
	t[j.JobID] = key
	return true
}

// jobSource is where job changes come from: the KV watch natively, list polls over TCP.
func jobSource(ctx context.Context, s *session, interval time.Duration) (func(context.Context, chan<- watchEvent), error) {
	if s.nc == nil {
		return pollJobs(ctx, s.cl, interval)
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, protocol.JobsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("no job bucket %s on %s: no jobbus coordinator has run there (is `jobbus serve` running?)", protocol.JobsBucket, s.target)
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s on %s: %w", protocol.JobsBucket, s.target, err)
	}
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return nil, fmt.Errorf("watch bucket %s: %w", protocol.JobsBucket, err)
	}
	return func(ctx context.Context, events chan<- watchEvent) {
		defer func() { _ = w.Stop() }()
		seen := jobTracker{}
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					emit(ctx, events, watchEvent{err: fmt.Errorf("watch of bucket %s ended", protocol.JobsBucket)})
					return
				}
				if ev, ok := kvEvent(e, seen); ok && !emit(ctx, events, ev) {
					return
				}
			}
		}
	}, nil
}

// kvEvent turns a KV entry (nil marks the end of the initial values) into an event.
func kvEvent(e jetstream.KeyValueEntry, seen jobTracker) (watchEvent, bool) {
	if e == nil {
		return watchEvent{}, false
	}
	at := e.Created().UnixMilli()
	if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
		delete(seen, e.Key())
		return watchEvent{Event: "job_removed", AtMillis: at, JobID: e.Key()}, true
	}
	j, err := recordSnapshot(e.Value())
	if err != nil || !seen.changed(j) {
		return watchEvent{}, false
	}
	return watchEvent{Event: "job", AtMillis: at, Job: &j}, true
}

// recordSnapshot decodes a job record of the JOBS bucket (protocol.Record, the
// schema the coordinator publishes) into the snapshot it shows.
func recordSnapshot(data []byte) (protocol.Job, error) {
	var r protocol.Record
	if err := json.Unmarshal(data, &r); err != nil {
		return protocol.Job{}, err
	}
	return r.Snapshot(), nil
}

// pollJobs lists every job each interval and passes on the changes; the first list is
// the baseline and prints nothing.
func pollJobs(ctx context.Context, cl *client.Client, interval time.Duration) (func(context.Context, chan<- watchEvent), error) {
	seen := jobTracker{}
	jobs, err := allJobs(ctx, cl)
	if err != nil {
		return nil, err
	}
	for _, j := range jobs {
		seen.changed(j)
	}
	return poll(interval, func(ctx context.Context, events chan<- watchEvent) bool {
		jobs, err := allJobs(ctx, cl)
		if err != nil {
			return true // a coordinator restarting; the next poll tells
		}
		for _, j := range slices.Backward(jobs) { // oldest first
			if seen.changed(j) && !emit(ctx, events, watchEvent{Event: "job", Job: &j}) {
				return false
			}
		}
		return true
	}), nil
}

// poll makes a source that runs tick each interval until ctx ends or tick reports
// false (its events could not be passed on).
func poll(interval time.Duration, tick func(context.Context, chan<- watchEvent) bool) func(context.Context, chan<- watchEvent) {
	return func(ctx context.Context, events chan<- watchEvent) {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if !tick(ctx, events) {
				return
			}
		}
	}
}

func allJobs(ctx context.Context, cl *client.Client) ([]protocol.Job, error) {
	req := protocol.ListJobs{Limit: 1000}
	var jobs []protocol.Job
	for {
		page, err := cl.List(ctx, req)
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

// workerSource polls the live workers each interval and passes on joins and leaves;
// the first list is the baseline and prints nothing.
func workerSource(ctx context.Context, s *session, interval time.Duration) (func(context.Context, chan<- watchEvent), error) {
	ws, err := s.cl.Workers(ctx)
	if err != nil {
		return nil, err
	}
	known := workerSet(ws)
	return poll(interval, func(ctx context.Context, events chan<- watchEvent) bool {
		ws, err := s.cl.Workers(ctx)
		if err != nil {
			return true
		}
		now := workerSet(ws)
		for _, ev := range workerChanges(known, now, ws) {
			if !emit(ctx, events, ev) {
				return false
			}
		}
		known = now
		return true
	}), nil
}

func workerSet(ws []protocol.Worker) map[string]protocol.Worker {
	m := make(map[string]protocol.Worker, len(ws))
	for _, w := range ws {
		m[w.WorkerID] = w
	}
	return m
}

// workerChanges lists the workers that left (known, not in now) and then those that
// joined (in now, sorted by id as the list is).
func workerChanges(known, now map[string]protocol.Worker, list []protocol.Worker) []watchEvent {
	var evs []watchEvent
	ids := make([]string, 0, len(known))
	for id := range known {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if _, ok := now[id]; !ok {
			w := known[id]
			evs = append(evs, watchEvent{Event: "worker_left", Worker: &w})
		}
	}
	for _, w := range list {
		if _, ok := known[w.WorkerID]; !ok {
			evs = append(evs, watchEvent{Event: "worker_joined", Worker: &w})
		}
	}
	return evs
}
