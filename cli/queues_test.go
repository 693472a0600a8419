package cli_test

import (
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// queueInfo reads one queue from `jobbus queue ls --json`.
func (s *system) queueInfo(name string) (protocol.QueueInfo, bool) {
	s.t.Helper()
	code, out, errs := s.run("queue", "ls", "--json")
	if code != 0 {
		s.t.Fatalf("queue ls: exit %d: %s", code, errs)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		var q protocol.QueueInfo
		if err := json.Unmarshal([]byte(line), &q); err == nil && q.Name == name {
			return q, true
		}
	}
	return protocol.QueueInfo{}, false
}

// submitTo submits a SHA256 job to queue through the CLI and returns its id.
func (s *system) submitTo(queue, text string) string {
	s.t.Helper()
	code, out, errs := s.run("submit", "sha256", "--text", text, "--queue", queue, "--json")
	if code != 0 {
		s.t.Fatalf("submit to %s: exit %d: %s", queue, code, errs)
	}
	return jsonJob(s.t, out).JobID
}

// TestQueuePauseSurvivesLeaderKill: a paused queue accepts jobs and starts none, and
// stays paused when its leader is SIGKILLed and the standby takes over; resumed, its
// jobs run. A worker serving the paused queue and another one shows the worker is
// there and takes work meanwhile.
func TestQueuePauseSurvivesLeaderKill(t *testing.T) {
	t.Parallel()
	s := startNATS(t)
	leader, standby := s.leaderAndStandby("--leader-lease-millis", "2000")

	code, _, errs := s.run("queue", "pause", "reports")
	if code != 1 || !strings.Contains(errs, "Unknown queue: 'reports'") {
		t.Fatalf("pause of an unknown queue: exit %d: %s", code, errs)
	}
	held := s.submitTo("reports", "held") // the queue's first use makes it
	if code, out, errs := s.run("queue", "pause", "reports", "--json"); code != 0 || !strings.Contains(out, `"paused":true`) {
		t.Fatalf("pause: exit %d: %s %s", code, out, errs)
	}
	held2 := s.submitTo("reports", "held too") // a paused queue accepts jobs
	s.startWorkerProc("--queues", "reports=1,default=1")
	s.waitState(s.submitTo("default", "runs"), protocol.StateCompleted)
	if st := s.job(held).State; st != protocol.StateQueued {
		t.Fatalf("a job of the paused queue: %s, want QUEUED", st)
	}

	killed := time.Now()
	leader.signal(syscall.SIGKILL)
	<-leader.done
	servingSince(t, standby, killed)
	// The new leader dispatches (the worker registered with it), and keeps the pause.
	s.waitState(s.submitTo("default", "runs after"), protocol.StateCompleted)
	q, ok := s.queueInfo("reports")
	if !ok || !q.Paused || q.Queued != 2 {
		t.Fatalf("after the failover: %+v (listed %v), want paused with 2 queued", q, ok)
	}
	for _, id := range []string{held, held2} {
		if st := s.job(id).State; st != protocol.StateQueued {
			t.Fatalf("job %s of the paused queue after the failover: %s, want QUEUED", id, st)
		}
	}

	if code, out, errs := s.run("queue", "resume", "reports", "--json"); code != 0 || strings.Contains(out, `"paused":true`) {
		t.Fatalf("resume: exit %d: %s %s", code, out, errs)
	}
	s.waitState(held, protocol.StateCompleted)
	s.waitState(held2, protocol.StateCompleted)
}

// TestQueueCommandsRefuseBadInput: usage errors exit 2 before connecting.
func TestQueueCommandsRefuseBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"queue", "pause", "a.b"}, `bad queue name "a.b"`},
		{[]string{"queue", "set", "low"}, "queue set needs --max-running or --key-concurrency"},
		{[]string{"queue", "set", "low", "--max-running", "-1"}, "--max-running must not be negative, got -1"},
		{[]string{"queue", "resume"}, "NAME"},
		{[]string{"submit", "sha256", "--text", "x", "--queue", "no way"}, `--queue: bad queue name "no way"`},
		{[]string{"worker", "--queues", "a=0"}, "--queues: bad queue weight of a: must be in 1..1000, got 0"},
		{[]string{"worker", "--strict-queues"}, "--strict-queues needs --queues"},
	} {
		code, _, errs := cliRun([]string{"--nats", "nats://127.0.0.1:1"}, tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("jobbus %s: exit %d: %s; want exit 2 saying %q", strings.Join(tc.args, " "), code, errs, tc.want)
		}
	}
}

// TestQueueListCountsJobsForLater: `queue ls` shows a queue whose jobs are all due
// later (SCHEDULED) or wait on another job (WAITING) with its unfinished jobs counted,
// in the table (UNFINISHED) and its JSON (unfinished); before, it showed only its depth
// and running jobs, both 0, which read as an empty queue.
func TestQueueListCountsJobsForLater(t *testing.T) {
	t.Parallel()
	s := setup(t, noWorker())
	code, out, errs := s.run("submit", "sha256", "--text", "later", "--queue", "later", "--in", "1h", "--json")
	if code != 0 {
		t.Fatalf("submit: exit %d: %s", code, errs)
	}
	first := jsonJob(t, out).JobID
	if code, _, errs := s.run("submit", "sha256", "--text", "after", "--queue", "later", "--after", first); code != 0 {
		t.Fatalf("submit --after: exit %d: %s", code, errs)
	}
	if code, out, errs = s.run("queue", "ls"); code != 0 {
		t.Fatalf("queue ls: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	header := strings.Fields(lines[0])
	col := slices.Index(header, "UNFINISHED")
	var row []string
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "later" {
			row = f
		}
	}
	if col < 0 || row == nil || col >= len(row) || row[col] != "2" {
		t.Fatalf("queue ls:\n%s\nwant queue later with UNFINISHED 2", out)
	}
	if code, out, errs = s.run("queue", "ls", "--json"); code != 0 || !strings.Contains(out, `"name":"later"`) {
		t.Fatalf("queue ls --json: exit %d: %s %s", code, out, errs)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		if strings.Contains(line, `"name":"later"`) && !strings.Contains(line, `"unfinished":2`) {
			t.Fatalf("queue ls --json: %s; want unfinished 2", line)
		}
	}
}
