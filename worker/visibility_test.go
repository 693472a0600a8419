package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
)

// logArgs is the payload of the LOGGER test type: it writes Lines records, then
// waits for release (when Hold) before it returns.
type logArgs struct {
	Lines int  `json:"lines"`
	Hold  bool `json:"hold,omitempty"`
	Flood bool `json:"flood,omitempty"` // then logs as fast as it can until released
	// CleanupMillis: a held job cancelled logs "cleaning up", takes this long, and
	// logs "cleaned up" before it returns.
	CleanupMillis int `json:"cleanupMillis,omitempty"`
}

// visibilitySetup starts a system with a worker serving LOGGER, whose held jobs wait
// for release to be closed.
func visibilitySetup(t *testing.T) (*jobbustest.System, *client.Client, func()) {
	t.Helper()
	// A worker whose handler floods its log on a loaded machine must not be taken for lost.
	sys := jobbustest.Start(t, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) { c.HeartbeatTimeout = 10 * time.Second }))
	release := make(chan struct{})
	releaseAll := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseAll)
	w, _ := sys.StartFunctionWorker(t, func(w *worker.Worker) error {
		return worker.HandleJSON(w, "LOGGER", func(ctx context.Context, attempt int, a logArgs) (string, error) {
			log := worker.Logger(ctx)
			for i := range a.Lines {
				log.Info("step", "i", i, "of", a.Lines)
			}
			for i := 0; a.Flood && !closed(release); i++ {
				log.Info("flood", "i", i, "filler", "0123456789abcdef0123456789abcdef")
			}
			if a.Hold {
				select {
				case <-release:
				case <-ctx.Done():
					if a.CleanupMillis > 0 {
						log.Warn("cleaning up")
						time.Sleep(time.Duration(a.CleanupMillis) * time.Millisecond) // the handler's work, not a wait for the test
						log.Warn("cleaned up")
					}
					return "", ctx.Err()
				}
				log.Warn("released")
			}
			return "logged", nil
		})
	})
	cl := client.New(sys.NC)
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	return sys, cl, releaseAll
}

func TestJobLogsOverNATS(t *testing.T) {
	t.Parallel()
	_, cl, _ := visibilitySetup(t)
	ctx := context.Background()
	id, err := cl.Submit(ctx, "LOGGER", logArgs{Lines: 5})
	if err != nil {
		t.Fatal(err)
	}
	if job, err := cl.Wait(ctx, id); err != nil || job.State != protocol.StateCompleted {
		t.Fatalf("job %s: %+v, %v", id, job, err)
	}
	var got []string
	err = cl.Logs(ctx, id, false, func(r client.LogRecord) error {
		_, level, msg := r.Fields()
		var f struct {
			I       int `json:"i"`
			Attempt int `json:"attempt"`
		}
		if err := json.Unmarshal(r.JSON, &f); err != nil {
			t.Errorf("record %s: %v", r.JSON, err)
		}
		if r.Attempt != 1 || f.Attempt != 1 {
			t.Errorf("record %s: attempt %d, want 1", r.JSON, r.Attempt)
		}
		got = append(got, fmt.Sprintf("%s %s %d", level, msg, f.I))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "INFO step 0,INFO step 1,INFO step 2,INFO step 3,INFO step 4"
	if strings.Join(got, ",") != want {
		t.Fatalf("log records\n got %s\nwant %s", strings.Join(got, ","), want)
	}
}

// TestJobLogsFollowEndsWithTheJob: a follow hands records as they are written, and
// returns once the job has ended, with its last record.
func TestJobLogsFollowEndsWithTheJob(t *testing.T) {
	t.Parallel()
	_, cl, release := visibilitySetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := cl.Submit(ctx, "LOGGER", logArgs{Lines: 2, Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	records := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		done <- cl.Logs(ctx, id, true, func(r client.LogRecord) error {
			_, _, msg := r.Fields()
			records <- msg
			return nil
		})
	}()
	for i := range 2 { // live, while the job still runs
		select {
		case msg := <-records:
			if msg != "step" {
				t.Fatalf("record %d: %q, want step", i, msg)
			}
		case err := <-done:
			t.Fatalf("follow ended while the job runs: %v", err)
		case <-ctx.Done():
			t.Fatal("no record while the job runs")
		}
	}
	if job, err := cl.Status(ctx, id); err != nil || job.State != protocol.StateRunning {
		t.Fatalf("job %s: %s, %v; want RUNNING", id, job.State, err)
	}
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("follow did not end with the job")
	}
	if msg := <-records; msg != "released" {
		t.Fatalf("last record %q, want released", msg)
	}
}

// TestJobLogsFollowWaitsForACancelledHandler: the job ends when it is cancelled, but
// its handler goes on to clean up, and logs while it does: a follow hands those
// records too, as it waits for the attempt's last chunk (the worker ships it when the
// handler returns).
func TestJobLogsFollowWaitsForACancelledHandler(t *testing.T) {
	t.Parallel()
	sys, cl, _ := visibilitySetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := cl.Submit(ctx, "LOGGER", logArgs{Lines: 1, Hold: true, CleanupMillis: 500})
	if err != nil {
		t.Fatal(err)
	}
	records := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		done <- cl.Logs(ctx, id, true, func(r client.LogRecord) error {
			_, _, msg := r.Fields()
			records <- msg
			return nil
		})
	}()
	select {
	case msg := <-records:
		if msg != "step" {
			t.Fatalf("first record %q, want step", msg)
		}
	case err := <-done:
		t.Fatalf("follow ended while the job runs: %v", err)
	case <-ctx.Done():
		t.Fatal("no record while the job runs")
	}
	if ok, _, err := cl.Cancel(ctx, id); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	start := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("follow did not end")
	}
	close(records)
	var got []string
	for msg := range records {
		got = append(got, msg)
	}
	if strings.Join(got, ",") != "cleaning up,cleaned up" {
		t.Fatalf("records after the cancel %q (follow ended %v after it), want the handler's cleanup", got, time.Since(start))
	}
	// What the follow waited for, rather than its grace: the attempt's last chunk.
	js, err := jetstream.New(sys.NC)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, protocol.LogsStream)
	if err != nil {
		t.Fatal(err)
	}
	last, err := stream.GetLastMsgForSubject(ctx, protocol.LogSubject(id))
	if err != nil {
		t.Fatal(err)
	}
	if last.Header.Get(protocol.HeaderLogFinal) == "" || last.Header.Get(protocol.HeaderLogAttempt) != "1" {
		t.Fatalf("the log's last chunk has headers %v, want attempt 1's last (%s)", last.Header, protocol.HeaderLogFinal)
	}
}

// TestJobLogFloodIsBounded: a handler that logs far more than a job keeps loses its
// own oldest records (the stream keeps LogChunksPerJob chunks of its subject), with a
// marker, and its job still completes.
func TestJobLogFloodIsBounded(t *testing.T) {
	t.Parallel()
	sys, cl, release := visibilitySetup(t)
	ctx := context.Background()
	id, err := cl.Submit(ctx, "LOGGER", logArgs{Flood: true})
	if err != nil {
		t.Fatal(err)
	}
	// The flood goes on until the stream has dropped the job's oldest chunk and the
	// worker has dropped records, however slowly this machine ships them.
	testkit.Eventually(t, time.Minute, "the job's log overflowed", func() bool {
		shipDropped, streamDropped, err := logMarkers(ctx, cl, id)
		return err == nil && shipDropped > 0 && streamDropped > 0
	})
	release()
	if job, err := cl.Wait(ctx, id); err != nil || job.State != protocol.StateCompleted {
		t.Fatalf("job %s: %+v, %v", id, job, err)
	}
	js, err := jetstream.New(sys.NC)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, protocol.LogsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(protocol.LogSubject(id)))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[protocol.LogSubject(id)]; n == 0 || n > protocol.LogChunksPerJob {
		t.Fatalf("job log holds %d chunks, want 1..%d", n, protocol.LogChunksPerJob)
	}
	var bytes int
	err = cl.Logs(ctx, id, false, func(r client.LogRecord) error {
		bytes += len(r.JSON) + 1
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if bytes > protocol.MaxLogBytesPerJob+16<<10 {
		t.Fatalf("job log is %d bytes, want at most about %d", bytes, protocol.MaxLogBytesPerJob)
	}
	if shipDropped, streamDropped, err := logMarkers(ctx, cl, id); err != nil || shipDropped == 0 || streamDropped != 1 {
		t.Fatalf("markers: %d of records the worker dropped (want some), %d of chunks the stream dropped (want 1), %v", shipDropped, streamDropped, err)
	}
}

// logMarkers counts the markers of a job's log: records the worker dropped, and
// chunks the stream dropped.
func logMarkers(ctx context.Context, cl *client.Client, id string) (shipDropped, streamDropped int, err error) {
	err = cl.Logs(ctx, id, false, func(r client.LogRecord) error {
		_, _, msg := r.Fields()
		switch {
		case r.Dropped:
			streamDropped++
		case strings.Contains(msg, "log records dropped"):
			shipDropped++
		}
		return nil
	})
	return shipDropped, streamDropped, err
}

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestProgressOverNATSAPI: a handler's progress reaches the job's snapshot on the
// plain NATS API (progress, progressMessage); a handler reporting 100,000 times a
// second costs its job's record a few writes a second, and the job's states are the
// ones it would have had without it.
func TestProgressOverNATSAPI(t *testing.T) {
	t.Parallel()
	// A worker busy reporting on a loaded machine must not be taken for lost.
	sys := jobbustest.Start(t, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) { c.HeartbeatTimeout = 10 * time.Second }))
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	var reports atomic.Int64
	w, _ := sys.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("PROGRESS", func(ctx context.Context, _ int, _ json.RawMessage) (string, error) {
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			start := time.Now()
			for i := 0; ; {
				select {
				case <-gate:
					worker.Progress(ctx, 1, "all done")
					return "ok", nil
				case <-ctx.Done():
					return "", ctx.Err()
				case now := <-tick.C:
					// 100,000 a second, however late the ticks come.
					for due := int(now.Sub(start).Seconds() * 100_000); i < due; i++ {
						worker.Progress(ctx, float64(i%100)/100, fmt.Sprintf("report %d", i))
						reports.Add(1)
					}
				}
			}
		})
	})
	cl := client.New(sys.NC)
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	ctx := context.Background()
	id, err := cl.Submit(ctx, "PROGRESS", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(sys.NC)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, protocol.JobsBucket)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := kv.Watch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Stop() }()

	// The snapshot on the NATS API, as `nats req jobbus.api.status` shows it.
	status := func() map[string]any {
		msg, err := sys.NC.Request(protocol.APIPrefix+".status", []byte(`{"type":"GET_JOB_STATUS","jobId":"`+id+`"}`), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var reply struct {
			Job map[string]any `json:"job"`
		}
		if err := json.Unmarshal(msg.Data, &reply); err != nil {
			t.Fatal(err)
		}
		return reply.Job
	}
	testkit.Eventually(t, 15*time.Second, "progress in the snapshot", func() bool {
		j := status()
		msg, _ := j["progressMessage"].(string)
		_, has := j["progress"].(float64)
		return j["state"] == "RUNNING" && has && strings.HasPrefix(msg, "report ")
	})
	// Count the record's writes over two seconds of flood.
	drain := func() (n int, states []string) {
		for {
			select {
			case e := <-watch.Updates():
				if e == nil {
					continue
				}
				n++
				var r protocol.Record
				if err := json.Unmarshal(e.Value(), &r); err == nil {
					states = append(states, string(r.State))
				}
			default:
				return n, states
			}
		}
	}
	drain()
	from, before := time.Now(), reports.Load()
	time.Sleep(2 * time.Second)
	writes, _ := drain()
	secs := time.Since(from).Seconds()
	rate := float64(reports.Load()-before) / secs
	if rate < 10_000 {
		t.Fatalf("the handler reported only %.0f/s, want at least 10,000/s for the bound to mean something", rate)
	}
	// One write per coordinator.ProgressWriteEvery (4/s), and a little slack for timers.
	if perSec := float64(writes) / secs; perSec > 6 || writes == 0 {
		t.Fatalf("the job's record was written %d times in %.1fs (%.1f/s) while its handler reported %.0f/s; want a few a second", writes, secs, perSec, rate)
	}
	t.Logf("handler reported %.0f/s; record written %.1f/s", rate, float64(writes)/secs)
	release()
	job, err := cl.Wait(ctx, id)
	if err != nil || job.State != protocol.StateCompleted || job.Attempts != 1 {
		t.Fatalf("job: %+v %v", job, err)
	}
	_, states := drain()
	for _, st := range states {
		if st != string(protocol.StateRunning) && st != string(protocol.StateCompleted) {
			t.Fatalf("states written after the flood: %v", states)
		}
	}
	if j := status(); j["progress"] != 1.0 || j["progressMessage"] != "all done" {
		t.Fatalf("finished job's progress %v %q, want 1 and the last message", j["progress"], j["progressMessage"])
	}
}

// TestLoggerAfterTheAttemptEnded: a handler's context outlives its attempt (kept by a
// goroutine the handler started); its Logger then discards, and starts nothing that
// outlives the worker. Not parallel: it counts the worker's log shippers.
func TestLoggerAfterTheAttemptEnded(t *testing.T) {
	sys := jobbustest.Start(t)
	kept := make(chan context.Context, 1)
	w, stop := sys.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("KEEPER", func(ctx context.Context, _ int, _ json.RawMessage) (string, error) {
			kept <- ctx
			return "kept", nil
		})
	})
	cl := client.New(sys.NC)
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := cl.Submit(ctx, "KEEPER", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if job, err := cl.Wait(ctx, id); err != nil || job.State != protocol.StateCompleted {
		t.Fatalf("job %s: %+v, %v", id, job, err)
	}
	worker.Logger(<-kept).Info("after the attempt ended")
	stop()
	testkit.Eventually(t, 10*time.Second, "no log shipper left", func() bool {
		buf := make([]byte, 1<<20)
		return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "logShipper).run")
	})
}
