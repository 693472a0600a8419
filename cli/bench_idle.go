package cli

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// idleJobTimeout bounds each job of the idle run.
const idleJobTimeout = 30 * time.Second

// runIdle runs n jobs one at a time, after idleWarmup unmeasured ones, numbered from
// first: each is submitted once the one before has completed. A completion is seen
// when the system's NATS shows the COMPLETED record (a watch of the JOBS bucket),
// or, over --connect alone, by polling its status.
func runIdle(ctx context.Context, sys *benchSystem, n, first int) (idleResult, error) {
	cl := sys.clients[0]
	waitDone := func(ctx context.Context, id string) (time.Time, error) { return pollCompleted(ctx, cl, id) }
	if sys.nc != nil {
		wctx, cancel := context.WithCancel(ctx)
		w, err := watchCompletions(wctx, client.New(sys.nc))
		if err != nil {
			cancel()
			return idleResult{}, err
		}
		defer w.stop(cancel)
		waitDone = w.wait
	}
	var submit, start, total []time.Duration
	for i := range idleWarmup + n {
		jctx, cancel := context.WithTimeout(ctx, idleJobTimeout)
		t0 := time.Now()
		id, err := cl.Submit(jctx, sys.taskType, benchPayload(first+i))
		acked := time.Now()
		var done time.Time
		if err == nil {
			done, err = waitDone(jctx, id)
		}
		cancel()
		if err != nil {
			return idleResult{}, fmt.Errorf("idle run: %w", err)
		}
		if i < idleWarmup {
			continue
		}
		submit = append(submit, acked.Sub(t0))
		total = append(total, done.Sub(t0))
		if t := sys.probe.started(first + i); !t.IsZero() {
			start = append(start, t.Sub(t0))
		}
	}
	return idleResult{jobs: n, submit: newDist(submit), start: newDist(start), total: newDist(total)}, nil
}

// pollCompleted asks for a job's status until it is COMPLETED, and returns when it saw it.
func pollCompleted(ctx context.Context, cl *client.Client, id string) (time.Time, error) {
	for {
		job, err := cl.Status(ctx, id)
		if err != nil {
			return time.Time{}, err
		}
		switch {
		case job.State == protocol.StateCompleted:
			return time.Now(), nil
		case job.State.Terminal():
			return time.Time{}, fmt.Errorf("job %s ended %s", id, job.State)
		}
	}
}

// completionWatch notes when each job is seen COMPLETED on a watch of the jobs.
type completionWatch struct {
	mu     sync.Mutex
	at     map[string]time.Time
	signal chan struct{} // a completion was noted
	wg     sync.WaitGroup
}

func watchCompletions(ctx context.Context, cl *client.Client) (*completionWatch, error) {
	events, err := cl.Watch(ctx)
	if err != nil {
		return nil, fmt.Errorf("idle run: watch the jobs: %w", err)
	}
	w := &completionWatch{at: map[string]time.Time{}, signal: make(chan struct{}, 1)}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for ev := range events {
			if ev.Type != client.JobChanged || ev.Job.State != protocol.StateCompleted {
				continue
			}
			now := time.Now()
			w.mu.Lock()
			w.at[ev.Job.JobID] = now
			w.mu.Unlock()
			select {
			case w.signal <- struct{}{}:
			default:
			}
		}
	}()
	return w, nil
}

// wait returns when job id was seen COMPLETED.
func (w *completionWatch) wait(ctx context.Context, id string) (time.Time, error) {
	for {
		w.mu.Lock()
		t, ok := w.at[id]
		delete(w.at, id)
		w.mu.Unlock()
		if ok {
			return t, nil
		}
		select {
		case <-w.signal:
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("job %s not seen completed: %w", id, ctx.Err())
		}
	}
}

// stop ends the watch with cancel and waits for its goroutine.
func (w *completionWatch) stop(cancel context.CancelFunc) {
	cancel()
	w.wg.Wait()
}
