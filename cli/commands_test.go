package cli_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/testkit"
)

// forEachTransport runs test against a fresh system over every transport.
func forEachTransport(t *testing.T, test func(t *testing.T, o over), opts ...setupOption) {
	for _, tr := range transports() {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t, opts...)
			tr.prepare(s)
			test(t, over{s, tr})
		})
	}
}

func submitted(t *testing.T, out string) string {
	t.Helper()
	ids := jsonLines[struct {
		JobID string `json:"jobId"`
	}](t, out)
	if len(ids) != 1 || ids[0].JobID == "" {
		t.Fatalf("submit --json printed %q", out)
	}
	return ids[0].JobID
}

func TestSubmit(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		sum := sha256.Sum256([]byte("hello"))
		cases := []struct {
			name   string
			args   []string
			task   string
			result string
		}{
			{"SHA256WithText", []string{"sha256", "--text", "hello"}, "SHA256", hex.EncodeToString(sum[:])},
			{"WordCountEmptyText", []string{"Word_Count", "--text", ""}, "WORD_COUNT", "0"},
			{"SleepMilliseconds", []string{"SLEEP", "--milliseconds", "5", "--priority", "High"}, "SLEEP", "slept 5 ms"},
			{"PrimeCountLimit", []string{"prime_count", "--limit", "100"}, "PRIME_COUNT", "25"},
			{"FailUntilAttempt", []string{"fail", "--fail-until-attempt", "2", "--max-attempts", "3"}, "FAIL", "succeeded on attempt 2"},
			{"WholePayload", []string{"PRIME_COUNT", "--payload", `{"limit":10}`}, "PRIME_COUNT", "4"},
			{"FlagsAfterTask", []string{"sha256", "--text", "hello", "--idempotency-key", "k1"}, "SHA256", hex.EncodeToString(sum[:])},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				out, _ := o.mustRun(cli.ExitOK, append([]string{"submit", "--wait", "--json"}, tc.args...)...)
				j := jsonJob(t, out)
				if j.State != protocol.StateCompleted || j.TaskType != tc.task || j.Result == nil || *j.Result != tc.result {
					t.Errorf("job %+v, want %s COMPLETED with %q", j, tc.task, tc.result)
				}
			})
		}
	})
}

func TestSubmitPrintsIDForScripts(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		out, _ := o.mustRun(cli.ExitOK, "submit", "SHA256", "--text", "x")
		id := strings.TrimSpace(out)
		if len(id) != 36 || strings.Contains(id, " ") {
			t.Fatalf("submit printed %q, want the bare job id", out)
		}
		out, _ = o.mustRun(cli.ExitOK, "wait", id, "--json")
		if j := jsonJob(t, out); j.JobID != id || j.State != protocol.StateCompleted {
			t.Errorf("wait: %+v", j)
		}
		out, _ = o.mustRun(cli.ExitOK, "submit", "--json", "--priority", "low", "--max-attempts", "2", "SLEEP", "--milliseconds", "1")
		id = submitted(t, out)
		out, _ = o.mustRun(cli.ExitOK, "wait", "--json", id)
		if j := jsonJob(t, out); j.Priority != protocol.PriorityLow || j.MaxAttempts != 2 {
			t.Errorf("priority and max attempts not sent: %+v", j)
		}
	})
}

func TestIdempotencyKeyReturnsTheSameJob(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		a, _ := o.mustRun(cli.ExitOK, "submit", "sha256", "--text", "same", "--idempotency-key", "once")
		b, _ := o.mustRun(cli.ExitOK, "submit", "SHA256", "--text", "same", "--idempotency-key", "once")
		if a != b {
			t.Errorf("same key gave %q and %q", a, b)
		}
		_, errs := o.mustRun(cli.ExitError, "submit", "SHA256", "--text", "other", "--idempotency-key", "once")
		if !strings.Contains(errs, "already bound") {
			t.Errorf("conflict: %q", errs)
		}
	})
}

func TestStatus(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		id := jsonJob(t, first(o.mustRun(cli.ExitOK, "submit", "--wait", "--json", "WORD_COUNT", "--text", "a b c"))).JobID
		out, _ := o.mustRun(cli.ExitOK, "status", id, "--json")
		j := jsonJob(t, out)
		if j.JobID != id || j.Result == nil || *j.Result != "3" || j.Attempts != 1 || j.CreatedAtMillis == 0 {
			t.Errorf("status --json: %+v", j)
		}
		if j.WorkerID != nil || j.LastWorkerID == nil || *j.LastWorkerID != o.onlyWorker(t) {
			t.Errorf("status --json of a finished job: workerId %v, lastWorkerId %v; want null and %s", j.WorkerID, j.LastWorkerID, o.onlyWorker(t))
		}
		out, _ = o.mustRun(cli.ExitOK, "status", id)
		for _, want := range []string{"ID        " + id, "STATE     COMPLETED", "TASK      WORD_COUNT", "ATTEMPTS  1/3", "WORKER    " + o.onlyWorker(t), "RESULT    3", "ERROR     -"} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("status lacks %q:\n%s", want, out)
			}
		}
		_, errs := o.mustRun(cli.ExitError, "status", "no-such-job")
		if !strings.Contains(errs, "Unknown job: no-such-job") {
			t.Errorf("unknown job: %q", errs)
		}
	})
}

func first(a, _ string) string { return a }

// onlyWorker is the id of the system's one worker.
func (s *system) onlyWorker(t *testing.T) string {
	t.Helper()
	ws, err := client.New(s.NC).Workers(context.Background())
	if err != nil || len(ws) != 1 {
		t.Fatalf("workers %+v, %v; want one", ws, err)
	}
	return ws[0].WorkerID
}

func TestWaitExitCodes(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		t.Run("FailedExits1WithItsError", func(t *testing.T) {
			id := strings.TrimSpace(first(o.mustRun(cli.ExitOK, "submit", "FAIL", "--fail-until-attempt", "5", "--max-attempts", "1")))
			out, errs := o.mustRun(cli.ExitError, "wait", id)
			if !strings.Contains(out, "STATE     FAILED") || !strings.Contains(errs, "FAILED: deliberate failure on attempt 1 (failing until 5)") {
				t.Errorf("stdout %q stderr %q", out, errs)
			}
		})
		t.Run("SubmitWaitFailedExits1", func(t *testing.T) {
			out, errs := o.mustRun(cli.ExitError, "submit", "--wait", "--json", "FAIL", "--fail-until-attempt", "5", "--max-attempts", "1")
			if j := jsonJob(t, out); j.State != protocol.StateFailed || !strings.Contains(errs, "deliberate failure") {
				t.Errorf("job %+v, stderr %q", j, errs)
			}
		})
		t.Run("TimeoutExits1", func(t *testing.T) {
			id := strings.TrimSpace(first(o.mustRun(cli.ExitOK, "submit", "SLEEP", "--milliseconds", "600000")))
			_, errs := o.mustRun(cli.ExitError, "wait", id, "--timeout", "50ms")
			if !strings.Contains(errs, "still") || !strings.Contains(errs, "after 50ms") {
				t.Errorf("stderr %q", errs)
			}
			o.mustRun(cli.ExitOK, "cancel", id)
		})
	})
}

func TestCancel(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		id := strings.TrimSpace(first(o.mustRun(cli.ExitOK, "submit", "SLEEP", "--milliseconds", "600000")))
		eventually(t, "job running", func() bool {
			out, _ := o.mustRun(cli.ExitOK, "status", "--json", id)
			return jsonJob(t, out).State == protocol.StateRunning
		})
		type cancelled struct {
			Cancelled bool         `json:"cancelled"`
			Job       protocol.Job `json:"job"`
		}
		out, _ := o.mustRun(cli.ExitOK, "cancel", id, "--json")
		c := jsonLines[cancelled](t, out)
		if len(c) != 1 || !c[0].Cancelled || c[0].Job.State != protocol.StateCancelled || c[0].Job.JobID != id {
			t.Fatalf("cancel --json: %s", out)
		}
		out, errs := o.mustRun(cli.ExitOK, "cancel", id)
		if !strings.Contains(out, "STATE     CANCELLED") || !strings.Contains(errs, "already ended") {
			t.Errorf("second cancel: stdout %q stderr %q", out, errs)
		}
		_, errs = o.mustRun(cli.ExitError, "wait", id)
		if !strings.Contains(errs, "CANCELLED: cancelled by client request") {
			t.Errorf("wait on cancelled: %q", errs)
		}
		o.mustRun(cli.ExitError, "cancel", "no-such-job")
	})
}

func TestJobs(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		var ids []string
		for range 5 {
			out, _ := o.mustRun(cli.ExitOK, "submit", "--wait", "--json", "PRIME_COUNT", "--limit", "1000")
			ids = append(ids, jsonJob(t, out).JobID)
		}
		failed := jsonJob(t, first(o.mustRun(cli.ExitError, "submit", "--wait", "--json", "FAIL", "--fail-until-attempt", "9", "--max-attempts", "1"))).JobID
		ids = append(ids, failed)
		newestFirst := func(jobs []protocol.Job) []string {
			var got []string
			for _, j := range jobs {
				got = append(got, j.JobID)
			}
			return got
		}
		reversed := make([]string, len(ids))
		for i, id := range ids {
			reversed[len(ids)-1-i] = id
		}

		out, _ := o.mustRun(cli.ExitOK, "jobs", "--json")
		if got := newestFirst(jsonLines[protocol.Job](t, out)); strings.Join(got, ",") != strings.Join(reversed, ",") {
			t.Errorf("jobs --json = %v, want newest first %v", got, reversed)
		}
		out, errs := o.mustRun(cli.ExitOK, "list", "--limit", "2", "--json")
		page := jsonLines[protocol.Job](t, out)
		if len(page) != 2 || page[0].JobID != failed || !strings.Contains(errs, "--cursor ") {
			t.Fatalf("first page %v, stderr %q", newestFirst(page), errs)
		}
		cursor := strings.Fields(errs[strings.Index(errs, "--cursor ")+len("--cursor "):])[0]
		out, _ = o.mustRun(cli.ExitOK, "jobs", "--limit", "2", "--cursor", cursor, "--json")
		if got := newestFirst(jsonLines[protocol.Job](t, out)); strings.Join(got, ",") != strings.Join(reversed[2:4], ",") {
			t.Errorf("second page %v, want %v", got, reversed[2:4])
		}
		out, errs = o.mustRun(cli.ExitOK, "jobs", "--limit", "2", "--all", "--json")
		if got := newestFirst(jsonLines[protocol.Job](t, out)); strings.Join(got, ",") != strings.Join(reversed, ",") || errs != "" {
			t.Errorf("--all = %v (stderr %q), want %v", got, errs, reversed)
		}
		out, _ = o.mustRun(cli.ExitOK, "jobs", "--state", "Failed", "--json")
		if got := newestFirst(jsonLines[protocol.Job](t, out)); len(got) != 1 || got[0] != failed {
			t.Errorf("--state failed = %v", got)
		}
		out, _ = o.mustRun(cli.ExitOK, "jobs", "--limit", "3")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID  ") || !strings.Contains(lines[1], failed) ||
			!strings.Contains(lines[1], "FAILED") || !strings.Contains(lines[1], "1/1") || !strings.Contains(lines[2], "COMPLETED") {
			t.Errorf("table:\n%s", out)
		}
		if !strings.Contains(lines[2], "s ago") || strings.Index(lines[0], "STATE") != strings.Index(lines[1], "FAILED") {
			t.Errorf("table not aligned or without ages:\n%s", out)
		}
		if w := o.onlyWorker(t); strings.Index(lines[0], "WORKER") != strings.Index(lines[1], w) || !strings.Contains(lines[2], w) {
			t.Errorf("finished jobs do not show %s, the worker that ran them:\n%s", w, out)
		}
	})
}

func TestWorkers(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		id, _ := o.startWorker()
		out, _ := o.mustRun(cli.ExitOK, "workers", "--json")
		ws := jsonLines[protocol.Worker](t, out)
		found := false
		for _, w := range ws {
			found = found || (w.WorkerID == id && w.Capacity == 4 && w.LastHeartbeatMillis > 0)
		}
		if len(ws) != 2 || !found {
			t.Errorf("workers --json: %s", out)
		}
		out, _ = o.mustRun(cli.ExitOK, "workers")
		if !strings.HasPrefix(out, "WORKER ") || !strings.Contains(out, id) || strings.Count(out, "\n") != 3 {
			t.Errorf("workers table:\n%s", out)
		}
	})
}

func TestUsageErrorsExit2(t *testing.T) {
	t.Parallel()
	s := startNATS(t) // usage is refused before any coordinator is asked
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"BadPriority", []string{"submit", "SLEEP", "--milliseconds", "1", "--priority", "urgent"}, "--priority must be high, normal or low"},
		{"UnknownFlag", []string{"submit", "--bogus", "SLEEP"}, "submit: unknown flag --bogus"},
		{"UnknownFlagAfterArg", []string{"status", "x", "--bogus"}, "status: unknown flag --bogus"},
		{"MissingTask", []string{"submit"}, "submit needs TASK"},
		{"MissingTaskFlag", []string{"submit", "SLEEP"}, "SLEEP needs --milliseconds"},
		{"WrongTaskFlag", []string{"submit", "SLEEP", "--text", "x"}, "--text does not apply to SLEEP"},
		{"PayloadAndTaskFlag", []string{"submit", "SLEEP", "--milliseconds", "1", "--payload", "{}"}, "--milliseconds and --payload cannot be combined"},
		{"BadPayload", []string{"submit", "SLEEP", "--payload", "{nope"}, "--payload is not valid JSON"},
		{"UnknownTaskWithoutPayload", []string{"submit", "RESIZE", "--text", "x"}, "does not apply to RESIZE"},
		{"BadInteger", []string{"submit", "SLEEP", "--milliseconds", "soon"}, "invalid value"},
		{"BadRetries", []string{"submit", "SLEEP", "--milliseconds", "1", "--submit-retries", "-1"}, "--submit-retries must be 0 or more"},
		{"RetryMaxBelowBase", []string{"submit", "SLEEP", "--milliseconds", "1", "--submit-retry-max-millis", "10"}, "must be at least"},
		{"StatusWithoutID", []string{"status"}, "status needs ID"},
		{"WaitTwoIDs", []string{"wait", "a", "b"}, "wait needs ID, got 2"},
		{"BadState", []string{"jobs", "--state", "done"}, "--state must be one of scheduled, waiting, queued, running"},
		{"BadLimit", []string{"jobs", "--limit", "0"}, "--limit must be in 1..10000"},
		{"JobsWithArgument", []string{"jobs", "extra"}, "jobs takes no arguments"},
		{"BadInterval", []string{"watch", "--interval-millis", "0"}, "--interval-millis must be positive"},
		// A duration without a unit names its flag and the unit it lacks, whichever
		// duration flag it is; it said `invalid value "5" for flag --in: parse error`.
		{"DurationWithoutUnit", []string{"submit", "SLEEP", "--milliseconds", "1", "--in", "5"}, "--in 5: a duration needs a unit, such as 5s or 5m"},
		{"DurationWithoutUnitAfterEquals", []string{"submit", "SLEEP", "--milliseconds", "1", "--unique-for=90"}, "--unique-for 90: a duration needs a unit, such as 90s or 90m"},
		{"TimeoutWithoutUnit", []string{"submit", "SLEEP", "--milliseconds", "1", "--wait", "--timeout", "2.5"}, "--timeout 2.5: a duration needs a unit, such as 2.5s or 2.5m"},
		{"EveryWithoutUnit", []string{"schedule", "add", "x", "--every", "5", "SHA256", "--text", "a"}, "--every 5: a duration needs a unit, such as 5s or 5m"},
		{"BadDuration", []string{"submit", "SLEEP", "--milliseconds", "1", "--in", "soon"}, `--in must be a duration such as 30s, 5m or 1h, got "soon"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, errs := cliRun([]string{"--nats", s.url}, tc.args...)
			if code != cli.ExitUsage || !strings.Contains(errs, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errs, cli.ExitUsage, tc.want)
			}
		})
	}
}

func TestOverloadExits3(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		active := strings.TrimSpace(first(o.mustRun(cli.ExitOK, "submit", "SLEEP", "--milliseconds", "1")))
		_, errs := o.mustRun(cli.ExitOverload, "submit", "SLEEP", "--milliseconds", "1")
		if !strings.Contains(errs, "coordinator at capacity: 1 active jobs (limit 1)") {
			t.Errorf("stderr %q", errs)
		}
		o.mustRun(cli.ExitOverload, "submit", "SLEEP", "--milliseconds", "1",
			"--submit-retries", "2", "--submit-retry-base-millis", "1", "--submit-retry-max-millis", "2")

		// A retrying submission gets in once the active job is gone.
		done := make(chan int, 1)
		go func() {
			code, _, _ := o.run("submit", "SLEEP", "--milliseconds", "1",
				"--submit-retries", "100000", "--submit-retry-base-millis", "5", "--submit-retry-max-millis", "10")
			done <- code
		}()
		// Cancel with the Go client: the CLI runs one app at a time (appMu).
		if _, _, err := client.New(o.NC).Cancel(context.Background(), active); err != nil {
			t.Fatal(err)
		}
		select {
		case code := <-done:
			if code != cli.ExitOK {
				t.Errorf("retrying submit exited %d", code)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("retrying submit never got in")
		}
	}, withConfig(func(c *coordinator.Config) { c.MaxActiveJobs = 1 }), noWorker())
}

func TestNoCoordinator(t *testing.T) {
	t.Parallel()
	s := startNATS(t)
	for _, args := range [][]string{{"status", "x"}, {"submit", "SLEEP", "--milliseconds", "1"}, {"workers"}, {"jobs"}, {"watch"}} {
		code, _, errs := cliRun([]string{"--nats", s.url}, args...)
		if code != cli.ExitError || strings.Count(errs, "running?") != 1 || !strings.Contains(errs, "is `jobbus serve` running?") {
			t.Errorf("%v: exit %d, stderr %q; want the hint once", args, code, errs)
		}
	}
	code, _, errs := cliRun([]string{"--nats", s.url}, "status", "x")
	if code != cli.ExitError || !strings.Contains(errs, "no jobbus coordinator answered on "+s.url) {
		t.Errorf("status: exit %d, stderr %q", code, errs)
	}
	// Nothing listens on the port of a server that has shut down.
	dead := startNATS(t)
	url := dead.url
	dead.NC.Close()
	if err := dead.Server.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, _, errs = cliRun([]string{"--nats", url}, "jobs")
	if code != cli.ExitError || !strings.Contains(errs, "cannot reach NATS at "+url+" (is `jobbus serve` running?)") {
		t.Errorf("dead NATS: exit %d, stderr %q", code, errs)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("gave up on a dead NATS only after %v", took) // a bound, not a speed claim
	}
}

func TestNoCoordinatorOverTCP(t *testing.T) {
	t.Parallel()
	s := startNATS(t)
	s.startBridge()
	global := tcpTransport.flags(s)
	code, _, errs := cliRun(global, "status", "x")
	if code != cli.ExitError || !strings.Contains(errs, "coordinator unavailable") || !strings.Contains(errs, "is `jobbus serve` or `jobbus coordinator` running?") || strings.Count(errs, "running?") != 1 {
		t.Errorf("bridge without coordinator: exit %d, stderr %q", code, errs)
	}

	// A port nothing listens on any more.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	code, _, errs = cliRun([]string{"--connect", addr}, "jobs")
	if code != cli.ExitError || !strings.Contains(errs, "cannot reach the jobbus client port at "+addr+" (is `jobbus serve` or `jobbus bridge` running?)") || strings.Count(errs, "running?") != 1 {
		t.Errorf("dead port: exit %d, stderr %q", code, errs)
	}
}

func TestInterspersedFlags(t *testing.T) {
	t.Parallel()
	s := setup(t)
	o := over{s, natsTransport}
	id := strings.TrimSpace(first(o.mustRun(cli.ExitOK, "submit", "SHA256", "--text", "a", "--max-attempts", "2", "--priority", "low")))
	out, _ := o.mustRun(cli.ExitOK, "wait", id, "--timeout", "20s", "--json")
	if j := jsonJob(t, out); j.MaxAttempts != 2 || j.Priority != protocol.PriorityLow {
		t.Errorf("flags after the argument lost: %+v", j)
	}
	out, _ = o.mustRun(cli.ExitOK, "status", "--json", "--", id)
	if jsonJob(t, out).JobID != id {
		t.Errorf("-- then the id: %s", out)
	}
}

func TestEnvVars(t *testing.T) {
	s := setup(t) // t.Setenv: not parallel
	t.Setenv("JOBBUS_NATS", s.url)
	t.Setenv("JOBBUS_JSON", "true")
	t.Setenv("JOBBUS_SUBMIT_PRIORITY", "high")
	code, out, errs := cliRun(nil, "submit", "--wait", "SLEEP", "--milliseconds", "1")
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if j := jsonJob(t, out); j.Priority != protocol.PriorityHigh {
		t.Errorf("env priority not used: %+v", j)
	}
	var help strings.Builder
	runApp([]string{"jobbus", "submit", "--help"}, &help, &help)
	for _, want := range []string{"$JOBBUS_SUBMIT_PRIORITY", "$JOBBUS_SUBMIT_RETRIES", "$JOBBUS_JSON", "Examples:"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("submit --help lacks %q", want)
		}
	}
}

// TestSubmitEnvPayloadFlagOnlyForItsTasks: a task's payload flag set in the
// environment (JOBBUS_SUBMIT_TEXT) is shared configuration: it fills the payload of the
// tasks it belongs to, and leaves the others alone, and --payload on the command line
// wins over it. It made `jobbus submit SLEEP --milliseconds 1` exit 2, "--text does not
// apply to SLEEP", as if --text had been typed.
func TestSubmitEnvPayloadFlagOnlyForItsTasks(t *testing.T) {
	s := setup(t) // t.Setenv: not parallel
	o := over{s, natsTransport}
	t.Setenv("JOBBUS_SUBMIT_TEXT", "from the environment")
	out, _ := o.mustRun(cli.ExitOK, "submit", "--wait", "--json", "SLEEP", "--milliseconds", "1")
	if j := jsonJob(t, out); j.TaskType != "SLEEP" || j.State != protocol.StateCompleted {
		t.Errorf("SLEEP with JOBBUS_SUBMIT_TEXT set: %+v", j)
	}
	sum := sha256.Sum256([]byte("from the environment"))
	out, _ = o.mustRun(cli.ExitOK, "submit", "--wait", "--json", "sha256")
	if j := jsonJob(t, out); j.Result == nil || *j.Result != hex.EncodeToString(sum[:]) {
		t.Errorf("SHA256 without --text did not take JOBBUS_SUBMIT_TEXT: %+v", j)
	}
	sum = sha256.Sum256([]byte("typed"))
	out, _ = o.mustRun(cli.ExitOK, "submit", "--wait", "--json", "sha256", "--payload", `{"text":"typed"}`)
	if j := jsonJob(t, out); j.Result == nil || *j.Result != hex.EncodeToString(sum[:]) {
		t.Errorf("SHA256 --payload with JOBBUS_SUBMIT_TEXT set: %+v", j)
	}
	out, _ = o.mustRun(cli.ExitOK, "submit", "--wait", "--json", "sha256", "--text", "typed")
	if j := jsonJob(t, out); j.Result == nil || *j.Result != hex.EncodeToString(sum[:]) {
		t.Errorf("SHA256 --text typed with JOBBUS_SUBMIT_TEXT set: %+v", j)
	}
	if code, _, errs := o.run("submit", "SLEEP", "--milliseconds", "1", "--text", "typed"); code != cli.ExitUsage || !strings.Contains(errs, "--text does not apply to SLEEP") {
		t.Errorf("SLEEP --text typed: exit %d, stderr %q; want exit %d, --text does not apply", code, errs, cli.ExitUsage)
	}
}

// TestSubmitEnvPayloadFlags pins down how payload flags set only in the environment
// (JOBBUS_SUBMIT_<FLAG>) mix with each other and with the flags typed on the command
// line: typed flags win; else the task's own flag from the environment; else --payload
// from the environment; a flag of another task is a mistake only when typed.
func TestSubmitEnvPayloadFlags(t *testing.T) {
	s := setup(t) // t.Setenv: not parallel
	o := over{s, natsTransport}
	sha := func(text string) string {
		sum := sha256.Sum256([]byte(text))
		return hex.EncodeToString(sum[:])
	}
	cases := []struct {
		name   string
		env    map[string]string // JOBBUS_SUBMIT_ + key
		args   []string
		code   int
		result string // with cli.ExitOK: the job's result
		errs   string // otherwise: in stderr
	}{
		{"EnvTextTypedOtherTasksFlag", map[string]string{"TEXT": "env"}, []string{"SLEEP", "--limit", "5"},
			cli.ExitUsage, "", "--limit does not apply to SLEEP, which takes --milliseconds"},
		{"EnvTaskFlagTypedOtherTasksFlag", map[string]string{"MILLISECONDS": "3"}, []string{"SLEEP", "--text", "typed"},
			cli.ExitUsage, "", "--text does not apply to SLEEP, which takes --milliseconds"},
		{"EnvOtherTasksFlagTypedTaskFlag", map[string]string{"MILLISECONDS": "3"}, []string{"sha256", "--text", "typed"},
			cli.ExitOK, sha("typed"), ""},
		{"TwoEnvFlagsSleep", map[string]string{"TEXT": "env", "MILLISECONDS": "3"}, []string{"SLEEP"},
			cli.ExitOK, "slept 3 ms", ""},
		{"TwoEnvFlagsSha256", map[string]string{"TEXT": "env", "MILLISECONDS": "3"}, []string{"sha256"},
			cli.ExitOK, sha("env"), ""},
		{"EnvPayload", map[string]string{"PAYLOAD": `{"limit":10}`}, []string{"prime_count"},
			cli.ExitOK, "4", ""},
		{"EnvPayloadAndEnvOtherTasksFlag", map[string]string{"PAYLOAD": `{"limit":10}`, "TEXT": "env"}, []string{"prime_count"},
			cli.ExitOK, "4", ""},
		{"EnvTaskFlagOverEnvPayload", map[string]string{"PAYLOAD": `{"limit":10}`, "LIMIT": "100"}, []string{"prime_count"},
			cli.ExitOK, "25", ""},
		{"EnvPayloadTypedTaskFlag", map[string]string{"PAYLOAD": `{"limit":10}`}, []string{"prime_count", "--limit", "100"},
			cli.ExitOK, "25", ""},
		{"EnvTaskFlagTypedPayload", map[string]string{"LIMIT": "100"}, []string{"prime_count", "--payload", `{"limit":10}`},
			cli.ExitOK, "4", ""},
		{"EnvPayloadTypedOtherTasksFlag", map[string]string{"PAYLOAD": `{"limit":10}`}, []string{"prime_count", "--text", "typed"},
			cli.ExitUsage, "", "--text does not apply to PRIME_COUNT, which takes --limit"},
		{"EnvBadPayloadUnused", map[string]string{"PAYLOAD": "{nope"}, []string{"sha256", "--text", "typed"},
			cli.ExitOK, sha("typed"), ""},
		{"EnvBadPayloadUsed", map[string]string{"PAYLOAD": "{nope"}, []string{"sha256"},
			cli.ExitUsage, "", "--payload is not valid JSON: {nope"},
		{"EnvTextUnknownTask", map[string]string{"TEXT": "env"}, []string{"resize"},
			cli.ExitUsage, "", "RESIZE is not a built-in task"},
		{"EnvPayloadUnknownTask", map[string]string{"PAYLOAD": "{}", "TEXT": "env"}, []string{"resize"},
			cli.ExitError, "", "submit RESIZE: Unknown task type: RESIZE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv("JOBBUS_SUBMIT_"+k, v)
			}
			code, out, errs := o.run(append([]string{"submit", "--wait", "--json"}, tc.args...)...)
			switch {
			case code != tc.code:
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, out, errs)
			case code == cli.ExitOK:
				if j := jsonJob(t, out); j.State != protocol.StateCompleted || j.Result == nil || *j.Result != tc.result {
					t.Errorf("job %+v, want COMPLETED with %q", j, tc.result)
				}
			case !strings.Contains(errs, tc.errs):
				t.Errorf("stderr %q, want %q", errs, tc.errs)
			}
		})
	}
}

func TestHelpHasExamples(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"submit", "status", "wait", "cancel", "jobs", "workers", "watch", "completion"} {
		code, out, _ := cliRun(nil, cmd, "--help")
		if code != cli.ExitOK || !strings.Contains(out, "jobbus "+cmd) || !strings.Contains(out, "Example") {
			t.Errorf("%s --help (exit %d) has no example:\n%s", cmd, code, out)
		}
	}
}

func TestCompletion(t *testing.T) {
	t.Parallel()
	for shell, want := range map[string]string{"bash": "complete -o bashdefault", "ZSH": "compdef _jobbus_zsh_autocomplete jobbus"} {
		code, out, _ := cliRun(nil, "completion", shell)
		if code != cli.ExitOK || !strings.Contains(out, want) {
			t.Errorf("completion %s: exit %d\n%s", shell, code, out)
		}
	}
}

// runWatch runs watch until stop is called, returning its output as it grows. It holds
// appMu only until the command's action starts (see appMu).
func runWatch(t *testing.T, global []string, args ...string) (out *testkit.Buffer, stop func() error) {
	t.Helper()
	w := startWatch(t, global, args...)
	return w.out, w.stop
}

// watchRun is a watch startWatch started: finished closes when it ended, on its own or
// stopped; stop ends it and returns its error.
type watchRun struct {
	out      *testkit.Buffer
	finished <-chan struct{}
	stop     func() error
}

// startWatch is runWatch, for a test that also waits for watch to end on its own.
func startWatch(t *testing.T, global []string, args ...string) *watchRun {
	t.Helper()
	out := &testkit.Buffer{}
	errs := &testkit.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	var err error
	appMu.Lock()
	var unlock sync.Once
	app := cli.App(out, errs)
	for _, cmd := range app.Commands {
		if cmd.Name == "watch" {
			action := cmd.Action
			cmd.Action = func(c *ucli.Context) error {
				unlock.Do(appMu.Unlock)
				return action(c)
			}
		}
	}
	go func() {
		defer close(finished)
		defer unlock.Do(appMu.Unlock)
		err = app.RunContext(ctx, append(append([]string{"jobbus"}, global...), append([]string{"watch"}, args...)...))
	}()
	stop := func() error {
		cancel()
		<-finished
		return err
	}
	t.Cleanup(func() { _ = stop() })
	eventually(t, "watch in place", func() bool { return strings.Contains(errs.String(), "watching jobs and workers on ") })
	return &watchRun{out: out, finished: finished, stop: stop}
}

func TestWatch(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		out, stop := runWatch(t, o.tr.flags(o.system), "--interval-millis", "20")
		// The first poll (or the KV watch) is in place once a watch of workers sees a join.
		id, stopWorker := o.startWorker()
		eventually(t, "worker join in watch", func() bool { return strings.Contains(out.String(), "worker "+id+" joined (capacity 4)") })

		job := strings.TrimSpace(first(o.mustRun(cli.ExitOK, "submit", "SHA256", "--text", "watched")))
		eventually(t, "job completion in watch", func() bool {
			return strings.Contains(out.String(), "job "+job+"  COMPLETED   SHA256")
		})
		stopWorker()
		eventually(t, "worker leave in watch", func() bool { return strings.Contains(out.String(), "worker "+id+" left") })
		if err := stop(); err != nil {
			t.Errorf("watch ended with %v", err)
		}
	})
}

func TestWatchJSON(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		out, stop := runWatch(t, o.tr.flags(o.system), "--interval-millis", "20", "--json")
		type event struct {
			Event    string           `json:"event"`
			AtMillis int64            `json:"atMillis"`
			Job      *protocol.Job    `json:"job"`
			JobID    string           `json:"jobId"`
			Worker   *protocol.Worker `json:"worker"`
		}
		id, _ := o.startWorker()
		eventually(t, "worker join", func() bool { return strings.Contains(out.String(), id) })
		job := jsonJob(t, first(o.mustRun(cli.ExitError, "submit", "--wait", "--json", "FAIL", "--fail-until-attempt", "9", "--max-attempts", "2"))).JobID
		var states []protocol.State
		eventually(t, "job FAILED in watch", func() bool {
			states = states[:0]
			for _, ev := range jsonLines[event](t, out.String()) {
				if ev.Event == "job" && ev.Job.JobID == job {
					states = append(states, ev.Job.State)
				}
			}
			return len(states) > 0 && states[len(states)-1] == protocol.StateFailed
		})
		for _, ev := range jsonLines[event](t, out.String()) {
			if ev.AtMillis == 0 || (ev.Event == "job" && (ev.Job == nil || ev.Job.MaxAttempts != 2)) {
				t.Errorf("bad event %+v", ev)
			}
		}
		if err := stop(); err != nil {
			t.Errorf("watch ended with %v", err)
		}
	})
}

// TestWatchOverTCPGivesUpOnAGoneBridge: `jobbus watch --connect` whose bridge is gone
// (nothing answers at its address) ends with an error once --give-up-after passed
// without one, as a native watch ends once its NATS connection's reconnects ran out;
// it polled the dead address for ever, saying nothing.
func TestWatchOverTCPGivesUpOnAGoneBridge(t *testing.T) {
	t.Parallel()
	s := setup(t, noWorker())
	b := s.StartBridge(t, func(c *bridge.Config) { c.WorkerListen = "" })
	addr := b.ClientAddr().String()
	w := startWatch(t, []string{"--nats", "nats://127.0.0.1:1", "--connect", addr}, "--interval-millis", "20", "--give-up-after", "300ms")
	_ = b.Close()
	start := time.Now()
	select {
	case <-w.finished:
	case <-time.After(10 * time.Second):
		t.Fatal("watch --connect still polls 10s after its bridge closed")
	}
	err := w.stop()
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("watch gave up %v after its bridge closed, before its --give-up-after 300ms", took)
	}
	if err == nil || !strings.Contains(err.Error(), "no jobbus bridge answered on "+addr) || !strings.Contains(err.Error(), "gave up") {
		t.Fatalf("watch whose bridge is gone ended with %v; want an error that it gave up, naming the address", err)
	}
}

// TestSameOutputOverBothTransports: the CLI prints the same bytes whichever way it
// reaches the coordinator.
func TestSameOutputOverBothTransports(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.startBridge()
	nats, tcp := over{s, natsTransport}, over{s, tcpTransport}
	id := jsonJob(t, first(nats.mustRun(cli.ExitOK, "submit", "--wait", "--json", "SHA256", "--text", "both"))).JobID
	nats.mustRun(cli.ExitError, "submit", "--wait", "FAIL", "--fail-until-attempt", "3", "--max-attempts", "1")
	for _, args := range [][]string{
		{"status", "--json", id},
		{"wait", "--json", id},
		{"jobs", "--json"},
		{"jobs", "--json", "--limit", "1", "--all"},
		{"jobs", "--state", "failed", "--json"},
		{"cancel", "--json", id},
	} {
		a, _ := nats.mustRun(cli.ExitOK, args...)
		b, _ := tcp.mustRun(cli.ExitOK, args...)
		if a != b || a == "" {
			t.Errorf("%v differs:\nNATS: %s\nTCP:  %s", args, a, b)
		}
	}
}

// TestGlobalFlagsAnywhere: the global flags work before or after the command's name;
// after wins over before, and either wins over the environment.
func TestGlobalFlagsAnywhere(t *testing.T) {
	s := setup(t) // t.Setenv: not parallel
	const dead = "nats://127.0.0.1:1"
	tests := []struct {
		name   string
		env    string
		global []string
		args   []string
		reach  bool // the run reaches s; otherwise it names dead
	}{
		{"Before", "", []string{"--nats", s.url}, nil, true},
		{"After", "", nil, []string{"--nats", s.url}, true},
		{"AfterWinsOverBefore", "", []string{"--nats", dead}, []string{"--nats", s.url}, true},
		{"BeforeLosesToAfter", "", []string{"--nats", s.url}, []string{"--nats", dead}, false},
		{"Env", s.url, nil, nil, true},
		{"AfterWinsOverEnv", dead, nil, []string{"--nats", s.url}, true},
		{"BeforeWinsOverEnv", dead, []string{"--nats", s.url}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("JOBBUS_NATS", tt.env)
			code, _, errs := cliRun(tt.global, append([]string{"workers", "--json"}, tt.args...)...)
			switch {
			case tt.reach && code != cli.ExitOK:
				t.Fatalf("exit %d, want 0: %s", code, errs)
			case !tt.reach && (code != cli.ExitError || !strings.Contains(errs, dead)):
				t.Fatalf("exit %d (%s), want 1 naming %s", code, errs, dead)
			}
		})
	}
	t.Run("LogLevelAfter", func(t *testing.T) {
		code, _, errs := cliRun(nil, "coordinator", "--log-level", "loud")
		if code != cli.ExitUsage || !strings.Contains(errs, `--log-level must be debug, info, warn or error, got "loud"`) {
			t.Fatalf("exit %d: %s", code, errs)
		}
	})
	t.Run("WorkerKeepsItsConnect", func(t *testing.T) {
		var help strings.Builder
		runApp([]string{"jobbus", "worker", "--help"}, &help, &help)
		if got := strings.Count(help.String(), "--connect value"); got != 1 {
			t.Fatalf("worker --help lists --connect %d times:\n%s", got, help.String())
		}
	})
}
