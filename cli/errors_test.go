package cli_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestUsageErrorsInOneLine: a mistake on the command line exits 2 (never 3, the code
// of an overload rejection a script may retry) with one line on stderr that names
// the mistake with its dashes, suggests what is close, and dumps no help.
func TestUsageErrorsInOneLine(t *testing.T) {
	t.Parallel()
	s := startNATS(t) // refused before any coordinator is asked
	nats := []string{"--nats", s.url}
	cases := []struct {
		name   string
		global []string
		args   []string
		want   string
	}{
		{"UnknownCommand", nil, []string{"bogus"}, `unknown command "bogus" (see`},
		{"MistypedCommand", nil, []string{"sumbit"}, "did you mean `jobbus submit`?"},
		{"HelpOnUnknownCommand", nil, []string{"help", "bogus"}, "No help topic for 'bogus'"},
		{"UnknownFlagBeforeTask", nats, []string{"submit", "--tetx", "hi", "sha256"}, "submit: unknown flag --tetx, did you mean --text? (see `jobbus submit --help`)"},
		{"UnknownFlagAfterTask", nats, []string{"submit", "sha256", "--tetx", "hi"}, "submit: unknown flag --tetx, did you mean --text? (see `jobbus submit --help`)"},
		{"UnknownFlagNothingClose", nats, []string{"jobs", "--zzz"}, "jobs: unknown flag --zzz (see `jobbus jobs --help`)"},
		{"UnknownGlobalFlag", nil, []string{"--natz", "x", "jobs"}, "unknown flag --natz, did you mean --nats? (see `jobbus --help`)"},
		{"FlagWithoutValue", nats, []string{"submit", "sha256", "--text"}, "submit: --text needs a value"},
		{"BadFlagValue", nats, []string{"jobs", "--limit", "many"}, `jobs: invalid value "many" for flag --limit`},
		{"NegativeMaxAttempts", nats, []string{"submit", "sha256", "--text", "x", "--max-attempts", "-1"}, "--max-attempts must be 0 (the coordinator's default) or more, got -1"},
		{"UnknownTaskWithTaskFlag", nats, []string{"submit", "resize", "--text", "x"}, "--text does not apply to RESIZE, which is not a built-in task (FAIL, PRIME_COUNT, SHA256, SLEEP, WORD_COUNT); a task of your own takes --payload JSON"},
		{"UnknownTaskWithoutPayload", nats, []string{"submit", "resize"}, "RESIZE is not a built-in task (FAIL, PRIME_COUNT, SHA256, SLEEP, WORD_COUNT)"},
		{"ConnectOnServe", []string{"--connect", "127.0.0.1:7071"}, []string{"serve"}, "--connect does not apply to `jobbus serve`"},
		{"ConnectAfterServe", nil, []string{"serve", "--connect", "127.0.0.1:7071"}, "--connect does not apply to `jobbus serve`"},
		{"NATSOnVersion", nats, []string{"version"}, "--nats does not apply to `jobbus version`"},
		{"LogLevelOnJobs", []string{"--log-level", "debug"}, []string{"jobs"}, "--log-level does not apply to `jobbus jobs`"},
		{"EmbeddedFlagWithNATS", nats, []string{"serve", "--nats-http-listen", "127.0.0.1:8222"}, "--nats-http-listen configures the embedded NATS server"},
		{"TLSCertWithoutKey", []string{"--nats", s.url, "--tls-cert", "c.pem"}, []string{"jobs"}, "--tls-cert and --tls-key go together"},
		{"CredsAndNKey", []string{"--nats", s.url, "--nats-creds", "u.creds", "--nkey", "u.nk"}, []string{"jobs"}, "--nats-creds and --nkey are two ways to authenticate"},
		{"MissingContext", nil, []string{"jobs", "--context", "no-such-context-here"}, "--context: natscontext: no such context: no-such-context-here"},
		{"BadShell", nil, []string{"completion", "fish"}, "bash or zsh"},
		{"SystemUserWithoutPassword", nil, []string{"serve", "--nats-system-user", "ops", "--data-dir", "/nonexistent/jobbus-test"}, "--nats-system-user needs --nats-system-password"},
		{"CoordinatorMaxAttempts", []string{"--nats", "nats://127.0.0.1:1"}, []string{"coordinator", "--max-attempts", "-1"}, "max attempts must be at least 1, got -1"},
		{"ServeMaxAttempts", nil, []string{"serve", "--max-attempts", "-1", "--data-dir", "/nonexistent/jobbus-test"}, "max attempts must be at least 1, got -1"},
		{"NegativeGrace", nil, []string{"worker", "--shutdown-grace", "-1s"}, "--shutdown-grace must be 0 or more"},
		{"ServeBadSync", nil, []string{"serve", "--sync", "sometimes", "--data-dir", "/nonexistent/jobbus-test"}, `--sync must be default, always or a positive interval (1s, 100ms), got "sometimes"`},
		{"SyncWithNATS", nats, []string{"serve", "--sync", "always"}, "--sync configures the embedded NATS server"},
		{"BenchBadSync", nil, []string{"bench", "--sync", "0s"}, `--sync must be default, always or a positive interval (1s, 100ms), got "0s"`},
		{"BenchSyncOnExternal", []string{"--connect", "127.0.0.1:1"}, []string{"bench", "--sync", "always"}, "--sync applies to the system bench builds"},
		{"BenchNothing", nil, []string{"bench", "--jobs", "0"}, "nothing to measure: give --jobs, --idle or --scheduled"},
		{"BenchScheduledOnExternal", []string{"--connect", "127.0.0.1:1"}, []string{"bench", "--scheduled", "10"}, "--scheduled must be at least 0, and needs the in-process system"},
		{"SubmitTimeoutWithoutWait", nats, []string{"submit", "sha256", "--text", "x", "--timeout", "5s"}, "--timeout applies only with --wait: it is how long to wait for the job to end"},
		{"WorkflowTimeoutWithoutWait", nats, []string{"workflow", "submit", "etl.json", "--timeout", "5s"}, "--timeout applies only with --wait: it is how long to wait for the workflow to end"},
		{"SubmitInAndAt", nats, []string{"submit", "sha256", "--text", "x", "--in", "1m", "--at", "2026-12-24T09:00:00Z"}, "--in and --at cannot be combined: give the delay or the time"},
		{"SubmitNegativeIn", nats, []string{"submit", "sha256", "--text", "x", "--in", "-1m"}, "--in must not be negative, got -1m0s"},
		{"SubmitInTooFar", nats, []string{"submit", "sha256", "--text", "x", "--in", "100000h"}, "--in 100000h0m0s is more than 3660 days: a job is scheduled at most 10 years ahead"},
		{"SubmitAtTooFar", nats, []string{"submit", "sha256", "--text", "x", "--at", "2099-12-24T09:00:00Z"}, "--at 2099-12-24T09:00:00Z is more than 3660 days ahead: a job is scheduled at most 10 years ahead"},
		{"SubmitAtNotRFC3339", nats, []string{"submit", "sha256", "--text", "x", "--at", "tomorrow 9am"}, `--at must be an RFC 3339 time such as 2026-12-24T09:00:00Z (or with an offset, +01:00), got "tomorrow 9am"`},
		{"EmptyAfter", nats, []string{"submit", "sha256", "--text", "x", "--after", ""}, `--after "" names an empty job id (a shell variable that is not set?): give ID[,ID...]`},
		{"EmptyAfterAmongIDs", nats, []string{"submit", "sha256", "--text", "x", "--after", "0b7c2f0e-8a41-4d7e-9b43-3f6a1c2d9e10,"}, `--after "0b7c2f0e-8a41-4d7e-9b43-3f6a1c2d9e10," names an empty job id`},
		{"StrayWord", nats, []string{"submit", "sha256", "--text", "hello", "jobbus"}, `submit needs TASK, got 2 arguments: "jobbus" is a stray word; if it belongs to --text, quote the value: --text "hello jobbus"`},
		{"StrayWords", nats, []string{"submit", "sha256", "--text=it's", "a", "test", "--wait"}, `"a", "test" are stray words; if they belong to --text, quote the value: --text "it's a test"`},
		{"StrayWordAfterBoolFlag", nats, []string{"submit", "--wait", "sha256", "--json", "extra"}, `submit needs TASK, got 2 arguments: "extra" is a stray word; quote a value that has spaces (see ` + "`jobbus submit --help`)"},
		{"StrayID", nats, []string{"wait", "a", "b"}, `wait needs ID, got 2 arguments: "b" is a stray word`},
		{"TextAndPayload", nats, []string{"submit", "sha256", "--payload", `{"text":"x"}`, "--text", "y"}, "--text and --payload cannot be combined: give SHA256 either --text or the whole payload with --payload"},
		{"OtherTasksFlag", nats, []string{"submit", "sleep", "--text", "x"}, "--text does not apply to SLEEP, which takes --milliseconds (or the whole payload with --payload)"},
		{"MistypedTaskWithFlag", nats, []string{"submit", "sha265", "--text", "x"}, "--text does not apply to SHA265, which is not a built-in task: did you mean SHA256? (built-in tasks: "},
		{"MistypedTask", nats, []string{"submit", "prime-cuont"}, "PRIME_CUONT is not a built-in task: did you mean PRIME_COUNT?"},
		{"NegativeWorkers", nil, []string{"serve", "--workers", "-1", "--data-dir", "/nonexistent/jobbus-test"}, "--workers must be 0 or more, got -1"},
		{"ServeWorkerCapacity", nil, []string{"serve", "--workers", "1", "--worker-capacity", "0", "--data-dir", "/nonexistent/jobbus-test"}, "--worker-capacity must be in 1..1024, got 0"},
		{"BenchWithoutWorkers", nil, []string{"bench", "--workers", "0"}, "--workers must be 1 or more, got 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errs := cliRun(tc.global, tc.args...)
			if code != cli.ExitUsage || !strings.Contains(errs, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errs, cli.ExitUsage, tc.want)
			}
			if out != "" || strings.Count(errs, "\n") != 1 {
				t.Errorf("want one line on stderr and nothing on stdout, got stdout %q stderr %q", out, errs)
			}
		})
	}
}

// TestTaskNames: the built-ins answer to kebab-case, and an unknown task type the
// coordinator refuses comes with the list of the known ones.
func TestTaskNames(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		out, _ := o.mustRun(cli.ExitOK, "submit", "word-count", "--text", "one two three", "--wait", "--json")
		if j := jsonJob(t, out); j.TaskType != "WORD_COUNT" || j.Result == nil || *j.Result != "3" {
			t.Errorf("word-count ran as %+v", j)
		}
		_, errs := o.mustRun(cli.ExitError, "submit", "resize", "--payload", `{"width":10}`)
		if !strings.Contains(errs, "Unknown task type: RESIZE (built-in tasks: FAIL, PRIME_COUNT, SHA256, SLEEP, WORD_COUNT)") {
			t.Errorf("stderr %q", errs)
		}
		_, errs = o.mustRun(cli.ExitError, "submit", "sha265", "--payload", `{"text":"x"}`)
		if !strings.Contains(errs, "Unknown task type: SHA265, did you mean SHA256? (built-in tasks: FAIL, PRIME_COUNT, SHA256, SLEEP, WORD_COUNT)") {
			t.Errorf("mistyped task: stderr %q", errs)
		}
	})
}

// TestHelpShowsOnlyUsedGlobalsWithTheirVariables: each command's help lists the global
// flags it uses, each with its environment variable, and none it ignores.
func TestHelpShowsOnlyUsedGlobalsWithTheirVariables(t *testing.T) {
	t.Parallel()
	cases := []struct {
		cmd         string
		show, avoid []string
	}{
		{"jobs", []string{"--nats value", "[$JOBBUS_NATS]", "--connect value", "[$JOBBUS_CONNECT]", "--context value", "[$JOBBUS_CONTEXT]", "[$JOBBUS_TLS_CA]"}, []string{"--log-level"}},
		{"serve", []string{"--nats value", "[$JOBBUS_NATS]", "[$JOBBUS_LOG_LEVEL]", "[$JOBBUS_SHUTDOWN_GRACE]", "[$JOBBUS_NATS_HTTP_LISTEN]"}, []string{"--connect"}},
		{"worker", []string{"[$JOBBUS_WORKER_CONNECT]", "[$JOBBUS_NKEY]", "[$JOBBUS_LOG_FORMAT]", "--shutdown-grace value"}, nil},
		{"version", nil, []string{"--nats", "--connect", "--log-level"}},
		{"bench", []string{"[$JOBBUS_CONNECT]"}, []string{"--log-level"}},
	}
	for _, tc := range cases {
		code, out, _ := cliRun(nil, tc.cmd, "--help")
		if code != cli.ExitOK {
			t.Fatalf("%s --help: exit %d", tc.cmd, code)
		}
		for _, s := range tc.show {
			if !strings.Contains(out, s) {
				t.Errorf("%s --help lacks %q", tc.cmd, s)
			}
		}
		for _, s := range tc.avoid {
			if strings.Contains(out, s) {
				t.Errorf("%s --help shows %q, which it ignores", tc.cmd, s)
			}
		}
	}
}

// TestSubcommandsTakeOnlyTheGlobalsTheyUse: the subcommands of queue, limit and
// workflow, workflow itself and mu-node list in their help only the global flags they
// use, as docs/operations.md says of every command, and refuse the others: none of
// the client commands logs (--log-level, --log-format), and mu-node dials a Mu port,
// never NATS. Looked up by their own names ("ls", "set"), the subcommands took every
// global flag and ignored those.
func TestSubcommandsTakeOnlyTheGlobalsTheyUse(t *testing.T) {
	t.Parallel()
	client := []string{"[$JOBBUS_NATS]", "[$JOBBUS_CONNECT]", "[$JOBBUS_TLS_CA]"}
	logging := []string{"--log-level", "--log-format"}
	cases := []struct {
		cmd         []string
		show, avoid []string
	}{
		{[]string{"queue", "ls"}, client, logging},
		{[]string{"queue", "pause"}, client, logging},
		{[]string{"limit", "set"}, client, logging},
		{[]string{"workflow"}, client, logging},
		{[]string{"workflow", "retry"}, client, logging},
		{[]string{"mu-node"}, []string{"[$JOBBUS_MU_CONNECT]", "[$JOBBUS_LOG_LEVEL]"}, []string{"--nats ", "--context", "--nats-creds"}},
	}
	for _, tc := range cases {
		name := strings.Join(tc.cmd, " ")
		code, out, errs := cliRun(nil, append(tc.cmd, "--help")...)
		if code != cli.ExitOK {
			t.Fatalf("%s --help: exit %d: %s", name, code, errs)
		}
		for _, s := range tc.show {
			if !strings.Contains(out, s) {
				t.Errorf("%s --help lacks %q", name, s)
			}
		}
		for _, s := range tc.avoid {
			if strings.Contains(out, s) {
				t.Errorf("%s --help shows %q, which it ignores", name, s)
			}
		}
	}
	code, _, errs := cliRun(nil, "queue", "ls", "--log-level", "debug", "--nats", "nats://127.0.0.1:1")
	if want := "--log-level does not apply to `jobbus queue ls`"; code != cli.ExitUsage || !strings.Contains(errs, want) {
		t.Errorf("queue ls --log-level debug: exit %d, stderr %q; want %d and %q", code, errs, cli.ExitUsage, want)
	}
}

// TestGlobalFromEnvironmentNotRefused: a global flag set in the environment is shared
// configuration, not a mistake: a command that ignores it runs.
func TestGlobalFromEnvironmentNotRefused(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(jobbusBin, "version")
	cmd.Env = append(os.Environ(), "JOBBUS_CONNECT=127.0.0.1:7071", "JOBBUS_LOG_LEVEL=debug")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "jobbus version ") {
		t.Errorf("version with JOBBUS_CONNECT set: %v %s", err, out)
	}
}

// TestConnectFromEnvironmentUnusedByNATSCommands: logs and cluster read NATS only; a
// JOBBUS_CONNECT in the environment, there for the client commands, stays quietly
// unused by them (docs/operations.md) instead of failing them, while --connect on
// their command line is a usage mistake.
func TestConnectFromEnvironmentUnusedByNATSCommands(t *testing.T) {
	t.Parallel()
	s := setup(t)
	out, _ := over{s, natsTransport}.mustRun(cli.ExitOK, "submit", "sha256", "--text", "hi", "--json")
	id := submitted(t, out)
	for _, args := range [][]string{{"logs", id}, {"cluster"}} {
		cmd := exec.Command(jobbusBin, append([]string{"--nats", s.url}, args...)...)
		cmd.Env = append(os.Environ(), "JOBBUS_CONNECT=127.0.0.1:1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("jobbus %s with JOBBUS_CONNECT set: %v %s", strings.Join(args, " "), err, out)
		}
		if code, _, errs := cliRun([]string{"--nats", s.url, "--connect", "127.0.0.1:1"}, args...); code != cli.ExitUsage ||
			!strings.Contains(errs, "--connect does not apply to `jobbus "+args[0]+"`") {
			t.Errorf("jobbus --connect ... %s: exit %d, stderr %q; want %d, --connect does not apply", args[0], code, errs, cli.ExitUsage)
		}
	}
}

// screen is a terminal's stand-in: stdout and stderr end up on it, in order.
type screen struct{ testkit.Buffer }

func (s *screen) IsTerminal() bool { return true }

// TestWaitSpinnerClearedBeforeResult: on a terminal, the wait's spinner line is erased
// before the result is printed, so the result starts on a line of its own.
func TestWaitSpinnerClearedBeforeResult(t *testing.T) {
	t.Parallel()
	s := setup(t)
	var scr screen
	code := runApp([]string{"jobbus", "--nats", s.url, "submit", "sleep", "--milliseconds", "200", "--wait"}, &scr, &scr)
	got := scr.String()
	if code != cli.ExitOK {
		t.Fatalf("exit %d\n%q", code, got)
	}
	clear := "\r\x1b[K"
	i := strings.LastIndex(got, clear)
	if i < 0 || !strings.Contains(got[:i], "attempt 1/") {
		t.Fatalf("no spinner on the terminal: %q", got)
	}
	if rest := got[i+len(clear):]; !strings.HasPrefix(rest, "ID ") || !strings.Contains(rest, "COMPLETED") {
		t.Errorf("after the spinner's last erase the screen shows %q, want the result from its first line", rest)
	}
}

// TestContexts: --context reads a NATS CLI context by name or path; without --nats and
// --context, the selected one; the flags win over its fields.
func TestContexts(t *testing.T) {
	t.Parallel()
	s := setup(t, noWorker())
	cfg := t.TempDir()
	ctxDir := filepath.Join(cfg, "nats", "context")
	if err := os.MkdirAll(ctxDir, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(path, body string) {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(ctxDir, "local.json"), `{"description":"the test system","url":"`+s.url+`"}`)
	write(filepath.Join(ctxDir, "nowhere.json"), `{"url":"nats://127.0.0.1:1"}`)
	write(filepath.Join(cfg, "nats", "context.txt"), "local")

	cases := []struct {
		name string
		env  []string
		args []string
		ok   bool
	}{
		{"ByName", nil, []string{"--context", "local", "workers"}, true},
		{"ByEnvironment", []string{"JOBBUS_CONTEXT=local"}, []string{"workers"}, true},
		{"ByPath", nil, []string{"workers", "--context", filepath.Join(ctxDir, "local.json")}, true},
		{"Selected", nil, []string{"workers"}, true},
		{"FlagWinsOverContext", nil, []string{"--context", "nowhere", "--nats", s.url, "workers"}, true},
		{"ContextURLUsed", nil, []string{"--context", "nowhere", "workers"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(jobbusBin, tc.args...)
			cmd.Env = append(os.Environ(), append([]string{"XDG_CONFIG_HOME=" + cfg, "JOBBUS_NATS=", "JOBBUS_CONTEXT="}, tc.env...)...)
			out, err := cmd.CombinedOutput()
			switch {
			case tc.ok && (err != nil || !strings.HasPrefix(string(out), "WORKER")):
				t.Errorf("jobbus %s: %v\n%s", strings.Join(tc.args, " "), err, out)
			case !tc.ok && (err == nil || !strings.Contains(string(out), "cannot reach NATS at nats://127.0.0.1:1 (context nowhere)")):
				t.Errorf("jobbus %s: %v\n%s; want it to try the context's URL", strings.Join(tc.args, " "), err, out)
			}
		})
	}
}

// TestEveryFlagHasAVariable: as docs/operations.md says, every flag of every command is also
// read from an environment variable, and its help shows which.
func TestEveryFlagHasAVariable(t *testing.T) {
	t.Parallel()
	app := cli.App(&bytes.Buffer{}, &bytes.Buffer{})
	for _, cmd := range app.Commands {
		for _, f := range cmd.Flags {
			df, ok := f.(interface{ GetEnvVars() []string })
			if !ok || len(df.GetEnvVars()) == 0 {
				t.Errorf("%s --%s reads no environment variable", cmd.Name, f.Names()[0])
			}
		}
	}
}
