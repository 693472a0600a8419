package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// goldenNow is the fixed clock of the golden renderings.
var goldenNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func ms(ago time.Duration) int64 { return goldenNow.Add(-ago).UnixMilli() }

func str(s string) *string { return &s }

// goldenJobs are fixed snapshots in every state, with the values that stretch a table:
// long results, multi-line errors, an error kept after a later success.
func goldenJobs() []protocol.Job {
	return []protocol.Job{
		{JobID: "7d1f6f0a-2c4b-4e8e-9a51-0c3b5d7e9f11", TaskType: "SLEEP", State: protocol.StateQueued, Attempts: 0, MaxAttempts: 3,
			CreatedAtMillis: ms(2 * time.Second), UpdatedAtMillis: ms(2 * time.Second), Priority: protocol.PriorityLow},
		{JobID: "5a9e3c21-8f4d-4b6a-b2e7-1d0c9f8e7a62", TaskType: "PRIME_COUNT", State: protocol.StateRunning, Attempts: 1, MaxAttempts: 3,
			WorkerID: str("worker-1a2b3c4d"), CreatedAtMillis: ms(75 * time.Second), UpdatedAtMillis: ms(70 * time.Second), Priority: protocol.PriorityHigh},
		{JobID: "c3b2a190-6e5f-4d4c-8b3a-291807f6e5d4", TaskType: "FAIL", State: protocol.StateRetryWait, Attempts: 1, MaxAttempts: 3,
			Error:           str("deliberate failure on attempt 1 (failing until 3)"),
			CreatedAtMillis: ms(3 * time.Hour), UpdatedAtMillis: ms(3 * time.Hour), Priority: protocol.PriorityNormal},
		{JobID: "0f1e2d3c-4b5a-4968-8776-655443322110", TaskType: "SHA256", State: protocol.StateCompleted, Attempts: 2, MaxAttempts: 3,
			Result:          str("2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"),
			Error:           str("worker worker-9 lost (connection closed)"),
			CreatedAtMillis: ms(50 * time.Hour), UpdatedAtMillis: ms(49 * time.Hour), Priority: protocol.PriorityNormal},
		{JobID: "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d", TaskType: "FAIL", State: protocol.StateFailed, Attempts: 3, MaxAttempts: 3,
			Error:           str("deliberate failure on attempt 3 (failing until 9)\n(all 3 attempts used)"),
			CreatedAtMillis: ms(59 * time.Minute), UpdatedAtMillis: ms(58 * time.Minute), Priority: protocol.PriorityNormal},
		{JobID: "99887766-5544-4332-a110-ffeeddccbbaa", TaskType: "WORD_COUNT", State: protocol.StateCancelled, Attempts: 0, MaxAttempts: 1,
			Error:           str("cancelled by client request"),
			CreatedAtMillis: ms(10 * time.Minute), UpdatedAtMillis: ms(9 * time.Minute), Priority: protocol.PriorityNormal},
	}
}

func goldenWorkers() []protocol.Worker {
	return []protocol.Worker{
		{WorkerID: "worker-1a2b3c4d", Capacity: 4, ActiveTasks: 1, LastHeartbeatMillis: ms(1500 * time.Millisecond)},
		{WorkerID: "worker-long-name-for-alignment", Capacity: 1024, ActiveTasks: 1000, LastHeartbeatMillis: ms(5 * time.Second)},
	}
}

func goldenEvents() []watchEvent {
	jobs := goldenJobs()
	ws := goldenWorkers()
	at := goldenNow.UnixMilli()
	return []watchEvent{
		{Event: "worker_joined", AtMillis: at, Worker: &ws[0]},
		{Event: "job", AtMillis: at + 1000, Job: &jobs[0]},
		{Event: "job", AtMillis: at + 2000, Job: &jobs[1]},
		{Event: "job", AtMillis: at + 3000, Job: &jobs[2]},
		{Event: "job", AtMillis: at + 4000, Job: &jobs[3]},
		{Event: "job", AtMillis: at + 5000, Job: &jobs[4]},
		{Event: "job", AtMillis: at + 6000, Job: &jobs[5]},
		{Event: "job_removed", AtMillis: at + 7000, JobID: jobs[5].JobID},
		{Event: "worker_left", AtMillis: at + 8000, Worker: &ws[0]},
	}
}

func TestGolden(t *testing.T) {
	t.Parallel()
	jobs, workers := goldenJobs(), goldenWorkers()
	cases := []struct {
		name   string
		json   bool
		color  bool
		render func(p *printer) error
	}{
		{"jobs.txt", false, false, func(p *printer) error { return p.jobs(jobs) }},
		{"jobs_color.txt", false, true, func(p *printer) error { return p.jobs(jobs) }},
		{"jobs.json", true, false, func(p *printer) error { return p.jobs(jobs) }},
		{"jobs_empty.txt", false, false, func(p *printer) error { return p.jobs(nil) }},
		{"job_running.txt", false, false, func(p *printer) error { return p.job(jobs[1]) }},
		{"job_failed.txt", false, false, func(p *printer) error { return p.job(jobs[4]) }},
		{"job_completed.json", true, false, func(p *printer) error { return p.job(jobs[3]) }},
		{"workers.txt", false, false, func(p *printer) error { return p.workers(workers) }},
		{"workers.json", true, false, func(p *printer) error { return p.workers(workers) }},
		{"watch.txt", false, false, func(p *printer) error { return renderEvents(p) }},
		{"watch_color.txt", false, true, func(p *printer) error { return renderEvents(p) }},
		{"watch.json", true, false, func(p *printer) error { return renderEvents(p) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			p := &printer{w: &buf, json: tc.json, color: tc.color, now: func() time.Time { return goldenNow }, loc: time.UTC}
			if err := tc.render(p); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, buf.Bytes())
		})
	}
}

func renderEvents(p *printer) error {
	for _, ev := range goldenEvents() {
		if err := p.watchEvent(ev); err != nil {
			return err
		}
	}
	return nil
}

// golden compares got with testdata/golden/name, or rewrites that file with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cli -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test ./cli -run TestGolden -update rewrites it)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// TestColorKeepsColumnsAligned checks that colouring the state column moves nothing:
// with the escape codes removed, the coloured table is the plain one.
func TestColorKeepsColumnsAligned(t *testing.T) {
	t.Parallel()
	render := func(color bool) string {
		var buf bytes.Buffer
		p := &printer{w: &buf, color: color, now: func() time.Time { return goldenNow }, loc: time.UTC}
		if err := p.jobs(goldenJobs()); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	plain, colored := render(false), render(true)
	if !strings.Contains(colored, "\x1b[") {
		t.Fatal("no colour codes in the coloured table")
	}
	if got := stripANSI(colored); got != plain {
		t.Errorf("coloured table misaligned:\n%s\nplain:\n%s", got, plain)
	}
}

func stripANSI(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b {
			for i < len(s) && s[i] != 'm' {
				i++
			}
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func TestNoColorOffTerminal(t *testing.T) {
	t.Parallel()
	if colorAllowed(&bytes.Buffer{}) {
		t.Error("colour allowed on a buffer")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if colorAllowed(f) {
		t.Error("colour allowed on a regular file")
	}
}

func TestAgo(t *testing.T) {
	t.Parallel()
	cases := []struct {
		ago  time.Duration
		want string
	}{
		{0, "0s ago"},
		{-time.Second, "0s ago"}, // clock skew
		{3400 * time.Millisecond, "3s ago"},
		{59 * time.Second, "59s ago"},
		{90 * time.Second, "1m ago"},
		{59 * time.Minute, "59m ago"},
		{3 * time.Hour, "3h ago"},
		{47 * time.Hour, "47h ago"},
		{72 * time.Hour, "3d ago"},
	}
	for _, tc := range cases {
		if got := ago(goldenNow, ms(tc.ago)); got != tc.want {
			t.Errorf("ago(%v) = %q, want %q", tc.ago, got, tc.want)
		}
	}
	if got := ago(goldenNow, 0); got != "-" {
		t.Errorf("ago(no time) = %q, want -", got)
	}
}

func TestTruncate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"eleven char", 10, "eleven ch…"},
		{"ünïcödé wörds", 5, "ünïc…"},
		{"two\nlines\ttab", 20, "two lines tab"},
	}
	for _, tc := range cases {
		if got := truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestWorkerChanges(t *testing.T) {
	t.Parallel()
	a, b, c := protocol.Worker{WorkerID: "a"}, protocol.Worker{WorkerID: "b"}, protocol.Worker{WorkerID: "c"}
	before := workerSet([]protocol.Worker{a, b})
	list := []protocol.Worker{b, c}
	evs := workerChanges(before, workerSet(list), list)
	if len(evs) != 2 || evs[0].Event != "worker_left" || evs[0].Worker.WorkerID != "a" ||
		evs[1].Event != "worker_joined" || evs[1].Worker.WorkerID != "c" {
		t.Errorf("changes: %+v", evs)
	}
	if evs := workerChanges(before, before, []protocol.Worker{a, b}); len(evs) != 0 {
		t.Errorf("no change gave %+v", evs)
	}
}

func TestSpinnerLine(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	sp := &spinner{w: &buf, start: time.Now()}
	sp.show(protocol.Job{JobID: "j1", State: protocol.StateRunning, Attempts: 1, MaxAttempts: 3, WorkerID: str("worker-1")})
	sp.clear()
	got := buf.String()
	if !strings.HasPrefix(got, "\r\x1b[K") || !strings.Contains(got, "job j1 RUNNING, attempt 1/3 on worker-1 (") || !strings.HasSuffix(got, "s)\r\x1b[K") {
		t.Errorf("spinner wrote %q", got)
	}
}
