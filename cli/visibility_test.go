package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/worker"
)

// TestLogsFollowEndsWithTheJob: `jobbus logs ID --follow` prints a running job's log
// records as they are written and exits 0 once the job has ended, its last record
// printed; without --follow, --json prints the records as the worker wrote them.
func TestLogsFollowEndsWithTheJob(t *testing.T) {
	t.Parallel()
	s := setup(t, noWorker())
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	w, _ := s.StartFunctionWorker(t, func(w *worker.Worker) error {
		return w.Handle("NOTES", func(ctx context.Context, _ int, _ json.RawMessage) (string, error) {
			log := worker.Logger(ctx)
			for i := 0; ; i++ {
				log.Info("note", "n", i)
				select {
				case <-gate:
					log.Warn("bye", "notes", i+1)
					return "noted", nil
				case <-ctx.Done():
					return "", ctx.Err()
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
	})
	cl := client.New(s.NC)
	eventually(t, "worker listed", func() bool {
		_, out, _ := s.run("workers", "--json")
		return strings.Contains(out, w.ID())
	})
	id, err := cl.Submit(context.Background(), "NOTES", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	follow := startProc(t, nil, "--nats", s.url, "logs", id, "--follow")
	eventually(t, "records while the job runs", func() bool { return strings.Count(follow.stdout.String(), " note n=") >= 3 })
	if j, err := cl.Status(context.Background(), id); err != nil || j.State != protocol.StateRunning {
		t.Fatalf("job %s while following: %+v %v", id, j, err)
	}
	select {
	case <-follow.done:
		t.Fatalf("logs --follow ended while the job runs: %s", follow.stderr.String())
	default:
	}
	release()
	if code := follow.wait(); code != cli.ExitOK {
		t.Fatalf("logs --follow exited %d: %s", code, follow.stderr.String())
	}
	out := follow.stdout.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "WARN  #1 bye notes=") {
		t.Fatalf("last line %q, want the job's last record", last)
	}

	code, jsonOut, errs := s.run("logs", id, "--json")
	if code != cli.ExitOK {
		t.Fatalf("logs --json: exit %d: %s", code, errs)
	}
	recs := strings.Split(strings.TrimSpace(jsonOut), "\n")
	if len(recs) != len(lines) {
		t.Fatalf("logs --json printed %d records, --follow %d", len(recs), len(lines))
	}
	var first struct {
		Level   string `json:"level"`
		Msg     string `json:"msg"`
		N       int    `json:"n"`
		Attempt int    `json:"attempt"`
	}
	if err := json.Unmarshal([]byte(recs[0]), &first); err != nil || first.Msg != "note" || first.N != 0 || first.Attempt != 1 || first.Level != "INFO" {
		t.Fatalf("first record %s: %+v %v", recs[0], first, err)
	}
	if code, _, errs := s.run("logs", "no-such-job"); code != cli.ExitError || !strings.Contains(errs, "Unknown job") {
		t.Fatalf("logs of an unknown job: exit %d: %s", code, errs)
	}
}

// terminal is a buffer that says it is a terminal, as a person's screen is.
type terminal struct {
	mu sync.Mutex
	bytes.Buffer
}

func (t *terminal) IsTerminal() bool { return true }
func (t *terminal) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.Buffer.Write(p)
}

// TestWaitShowsProgress: SLEEP reports its progress, which `submit --wait` shows as a
// line per change when stderr is not a terminal and as a bar on one, and which
// `status --follow` shows until the job ends, then prints the job.
func TestWaitShowsProgress(t *testing.T) {
	t.Parallel()
	s := setup(t)
	code, out, errs := s.run("submit", "sleep", "--milliseconds", "1200", "--wait")
	if code != cli.ExitOK || !strings.Contains(out, "COMPLETED") {
		t.Fatalf("submit --wait: exit %d\n%s\n%s", code, out, errs)
	}
	if !strings.Contains(errs, "RUNNING, attempt 1/3: ") || !strings.Contains(errs, "% slept ") || !strings.Contains(errs, "100% slept 1200 of 1200 ms") {
		t.Fatalf("submit --wait off a terminal: want progress lines on stderr, got:\n%s", errs)
	}

	var screen terminal
	var stdout bytes.Buffer
	code = runApp([]string{"jobbus", "--nats", s.url, "submit", "sleep", "--milliseconds", "1200", "--wait"}, &stdout, &screen)
	if code != cli.ExitOK || !strings.Contains(screen.String(), "█") || !strings.Contains(screen.String(), "░") {
		t.Fatalf("submit --wait on a terminal: exit %d, want a progress bar:\n%q", code, screen.String())
	}

	id, err := client.New(s.NC).Submit(context.Background(), "SLEEP", map[string]int{"durationMillis": 1500})
	if err != nil {
		t.Fatal(err)
	}
	follow := startProc(t, nil, "--nats", s.url, "status", id, "--follow")
	if code := follow.wait(); code != cli.ExitOK {
		t.Fatalf("status --follow exited %d: %s", code, follow.stderr.String())
	}
	if e := follow.stderr.String(); !strings.Contains(e, "job "+id+" RUNNING, attempt 1/3: ") || !strings.Contains(e, "100% slept 1500 of 1500 ms") {
		t.Fatalf("status --follow's lines:\n%s", e)
	}
	if o := follow.stdout.String(); !strings.Contains(o, "COMPLETED") || !strings.Contains(o, "slept 1500 ms") || !strings.Contains(o, "PROGRESS  100% slept 1500 of 1500 ms") {
		t.Fatalf("status --follow's end:\n%s", o)
	}
}
