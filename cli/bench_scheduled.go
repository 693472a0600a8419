package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/client"
)

// bench --scheduled: delayed jobs that come due while the bench's load runs, and how
// late each starts against its due time (lateness), as the in-process workers see it.

func scheduledBenchFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "scheduled", Usage: "in-process system: first submit this many delayed jobs, due over --scheduled-spread from --scheduled-lead after the start, then run the --jobs load, and report how late each delayed job starts", EnvVars: env("bench-scheduled")},
		&cli.DurationFlag{Name: "scheduled-lead", Value: 10 * time.Second, Usage: "with --scheduled: the first due time, after the start (longer than submitting them takes)", EnvVars: env("bench-scheduled-lead")},
		&cli.DurationFlag{Name: "scheduled-spread", Value: 10 * time.Second, Usage: "with --scheduled: the due times spread evenly over this long", EnvVars: env("bench-scheduled-spread")},
	}
}

// scheduledResult is what the delayed jobs of a bench run measured.
type scheduledResult struct {
	n        int
	lateness dist // start at a worker - due time, of the jobs submitted before their due time
	// submittedLate were stored only after their due time (excluded), missing never started.
	submittedLate, missing int
	firstDue, lastDue      time.Time
}

// scheduledBench submits n delayed jobs, numbered from first for the probe, due over
// spread from lead after now, and returns once they are submitted; wait returns once
// they all started (or a minute after the last was due) with their lateness.
func scheduledBench(ctx context.Context, sys *benchSystem, n, first int, lead, spread time.Duration) (wait func() (scheduledResult, error), err error) {
	start := time.Now()
	due := make([]time.Time, n)
	for k := range due {
		due[k] = start.Add(lead + time.Duration(int64(spread)*int64(k)/int64(n))).Truncate(time.Millisecond)
	}
	late := make([]bool, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(sys.clients))
	for _, cl := range sys.clients {
		wg.Go(func() {
			for {
				k := int(next.Add(1)) - 1
				if k >= n {
					return
				}
				if _, err := cl.Submit(ctx, sys.taskType, benchPayload(first+k), client.RunAt(due[k])); err != nil {
					errs <- err
					return
				}
				late[k] = time.Now().After(due[k])
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, fmt.Errorf("submit delayed jobs: %w", err)
	}
	return func() (scheduledResult, error) {
		res := scheduledResult{n: n, firstDue: due[0], lastDue: due[n-1]}
		deadline := due[n-1].Add(time.Minute)
		for {
			res.missing, res.submittedLate = 0, 0
			var lateness []time.Duration
			for k := range n {
				switch t := sys.probe.started(first + k); {
				case late[k]:
					res.submittedLate++
				case t.IsZero():
					res.missing++
				default:
					lateness = append(lateness, t.Sub(due[k]))
				}
			}
			if res.missing == 0 || time.Now().After(deadline) {
				res.lateness = newDist(lateness)
				return res, nil
			}
			select {
			case <-ctx.Done():
				return res, errors.New("interrupted before the delayed jobs started")
			case <-time.After(50 * time.Millisecond):
			}
		}
	}, nil
}

// put adds the delayed jobs' figures to a report's metrics.
func (r scheduledResult) put(m map[string]float64) {
	m["scheduled.jobs"] = float64(r.n)
	m["scheduled.submitted_after_due"] = float64(r.submittedLate)
	m["scheduled.never_started"] = float64(r.missing)
	r.lateness.put(m, "scheduled.lateness")
}

// writeText writes the delayed jobs' line of the report; loadEnd is when the load's
// last job completed (zero without a load).
func (r scheduledResult) writeText(w io.Writer, loadEnd time.Time) {
	fmt.Fprintf(w, "scheduled: %d delayed jobs due over %v; lateness (start - due) %s",
		r.n, r.lastDue.Sub(r.firstDue).Round(time.Millisecond), r.lateness)
	if r.submittedLate > 0 || r.missing > 0 {
		fmt.Fprintf(w, "; %d stored after their due time (not counted), %d never started", r.submittedLate, r.missing)
	}
	fmt.Fprintln(w)
	if !loadEnd.IsZero() && loadEnd.Before(r.lastDue) {
		fmt.Fprintf(w, "scheduled: note: the load ended %v before the last due time; give more --jobs to measure under load throughout\n",
			r.lastDue.Sub(loadEnd).Round(time.Millisecond))
	}
}
