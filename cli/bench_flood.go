package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/worker"
)

// benchFloodType is the task type of --progress-flood's jobs: each reports progress
// --progress-rate times a second until the measured run ends.
const benchFloodType = "BENCH_PROGRESS_FLOOD"

// progressFlood is --progress-flood: jobs whose handlers report progress far faster
// than anyone should, running beside the measured jobs, so that the run shows what
// they cost the others; and how often their records were written meanwhile.
type progressFlood struct {
	jobs, rate int
	stop       chan struct{}
	reports    atomic.Int64
	ids        []string
	writes     atomic.Int64 // record writes of the flood jobs seen while measuring
	measuring  atomic.Bool
	from, to   time.Time
	reported   [2]int64 // reports at from and to
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

func progressFloodFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "progress-flood", Usage: "in-process native system: also run this many jobs whose handlers report progress --progress-rate times a second during the measured run", EnvVars: env("bench-progress-flood")},
		&cli.IntFlag{Name: "progress-rate", Value: 10000, Usage: "progress reports a second of each --progress-flood job", EnvVars: env("bench-progress-rate")},
	}
}

func newProgressFlood(c *cli.Context) *progressFlood {
	if c.Int("progress-flood") <= 0 {
		return nil
	}
	return &progressFlood{jobs: c.Int("progress-flood"), rate: max(1, c.Int("progress-rate")), stop: make(chan struct{})}
}

// handle declares the flood's task type on w.
func (f *progressFlood) handle(w *worker.Worker) error {
	if f == nil {
		return nil
	}
	return w.Handle(benchFloodType, f.run)
}

// run reports progress at f.rate a second (a batch each millisecond) until the flood
// stops.
func (f *progressFlood) run(ctx context.Context, _ int, _ json.RawMessage) (string, error) {
	start := time.Now()
	var n int64
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-f.stop:
			return fmt.Sprintf("%d progress reports", n), nil
		case now := <-t.C:
			from := n
			for due := int64(now.Sub(start).Seconds() * float64(f.rate)); n < due; n++ {
				worker.Progress(ctx, float64(n%1000)/1000, "flooding")
			}
			f.reports.Add(n - from)
		}
	}
}

// start submits the flood's jobs, waits until they run, and counts their record
// writes (JOBS bucket updates) from then on.
func (f *progressFlood) start(ctx context.Context, sys *benchSystem) error {
	cl := sys.clients[0]
	deadline := time.Now().Add(30 * time.Second)
	for len(f.ids) < f.jobs {
		id, err := cl.Submit(ctx, benchFloodType, map[string]any{})
		switch {
		case err != nil && strings.Contains(err.Error(), protocol.UnknownTaskType("").Message) && time.Now().Before(deadline):
			time.Sleep(20 * time.Millisecond) // the workers declare it as they register
		case err != nil:
			return fmt.Errorf("progress flood: %w", err)
		default:
			f.ids = append(f.ids, id)
		}
	}
	for _, id := range f.ids {
		for {
			j, err := cl.Status(ctx, id)
			if err != nil {
				return fmt.Errorf("progress flood: %w", err)
			}
			if j.State == protocol.StateRunning {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	js, err := jetstream.New(sys.nc)
	if err != nil {
		return err
	}
	kv, err := js.KeyValue(ctx, protocol.JobsBucket)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	for _, id := range f.ids {
		w, err := kv.Watch(wctx, id, jetstream.UpdatesOnly())
		if err != nil {
			cancel()
			return err
		}
		f.wg.Go(func() {
			defer func() { _ = w.Stop() }()
			for {
				select {
				case <-wctx.Done():
					return
				case e, ok := <-w.Updates():
					if !ok {
						return
					}
					if e != nil && f.measuring.Load() {
						f.writes.Add(1)
					}
				}
			}
		})
	}
	time.Sleep(time.Second) // the flood at full rate before the measured run
	f.from = time.Now()
	f.reported[0] = f.reports.Load()
	f.measuring.Store(true)
	return nil
}

// finish ends the measurement and the flood's jobs.
func (f *progressFlood) finish() {
	f.measuring.Store(false)
	f.to = time.Now()
	f.reported[1] = f.reports.Load()
	close(f.stop)
	if f.cancel != nil {
		f.cancel()
	}
	f.wg.Wait()
}

// report says what the flood's jobs cost.
func (f *progressFlood) report(w io.Writer) {
	secs := f.to.Sub(f.from).Seconds()
	if secs <= 0 {
		return
	}
	fmt.Fprintf(w, "progress flood: %d jobs, each reporting %.0f/s: each job's record written %.1f/s while measured (%d writes in %.1fs)\n",
		f.jobs, f.perJob(f.reported[1]-f.reported[0]), f.perJob(f.writes.Load()), f.writes.Load(), secs)
}

// put adds the flood's figures to --json's metrics: progress reports and record
// writes a second, per flood job, while the load was measured.
func (f *progressFlood) put(m map[string]float64) {
	if f.to.Sub(f.from) <= 0 {
		return
	}
	m["flood.reports_per_s"] = f.perJob(f.reported[1] - f.reported[0])
	m["flood.record_writes_per_s"] = f.perJob(f.writes.Load())
}

// perJob is n per flood job and second of the measured run.
func (f *progressFlood) perJob(n int64) float64 {
	return float64(n) / float64(f.jobs) / f.to.Sub(f.from).Seconds()
}

// running is the flood's jobs, which run on while the measured ones finish.
func (f *progressFlood) running() map[string]bool {
	if f == nil {
		return nil
	}
	m := make(map[string]bool, len(f.ids))
	for _, id := range f.ids {
		m[id] = true
	}
	return m
}
