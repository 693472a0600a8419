package cli

import (
	"context"
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
--connect it polls the job list. Workers are polled either way. It ends with an error,
exit 1, once what it reads from is gone: natively when NATS stayed away for its 30
reconnects (about a minute), over --connect when no bridge answered at the address for
--give-up-after (a minute).
With --json each line is {"event":"job"|"job_removed"|"worker_joined"|"worker_left","atMillis":...,
"job":{...}|"jobId":"..."|"worker":{...}}.

Example:
   jobbus watch --json | jq -c 'select(.event=="job" and .job.state=="FAILED")'`,
		Flags: []cli.Flag{
			&cli.Int64Flag{Name: "interval-millis", Value: 1000, Usage: "how often workers (and over --connect, jobs) are polled", EnvVars: env("interval-millis")},
			&cli.DurationFlag{Name: "give-up-after", Value: time.Minute, Usage: "over --connect: end with an error once no bridge answered at the address this long (0: poll until Ctrl-C)", EnvVars: env("give-up-after")},
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
	if c.Duration("give-up-after") < 0 {
		return usageError("--give-up-after must be 0 (never) or more, got %v", c.Duration("give-up-after"))
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
	jobs, err := jobSource(ctx, s, interval, c.Duration("give-up-after"))
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

// jobSource is where job changes come from: the Go client's Watch, which follows the
// KV bucket natively and polls the job list over TCP.
func jobSource(ctx context.Context, s *session, interval, giveUp time.Duration) (func(context.Context, chan<- watchEvent), error) {
	jobs, err := s.cl.Watch(ctx, client.WatchPollInterval(interval), client.WatchGiveUpAfter(giveUp))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("no job bucket %s on %s: no jobbus coordinator has run there (is `jobbus serve` running?)", protocol.JobsBucket, s.target)
	}
	if err != nil {
		return nil, fmt.Errorf("%w (on %s)", err, s.target)
	}
	return func(ctx context.Context, events chan<- watchEvent) {
		for ev := range jobs {
			if !emit(ctx, events, jobEvent(ev)) {
				return
			}
		}
	}, nil
}

// jobEvent is the line of watch for a change the client saw.
func jobEvent(ev client.JobEvent) watchEvent {
	switch {
	case ev.Err != nil:
		return watchEvent{err: ev.Err}
	case ev.Type == client.JobRemoved:
		return watchEvent{Event: "job_removed", AtMillis: ev.At.UnixMilli(), JobID: ev.Job.JobID}
	}
	j := ev.Job
	return watchEvent{Event: "job", AtMillis: ev.At.UnixMilli(), Job: &j}
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
