package cli_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/cli"
)

// seeHelpRE finds the help command a usage error points at.
var seeHelpRE = regexp.MustCompile("see `jobbus ([^`]*) --help`")

// TestSubcommandUsageErrors: a mistake under queue, limit, workflow or schedule exits 2
// with one line that names the command as typed (`jobbus queue ls`, not `jobbus ls`,
// which is no command) and a help that works, and a mistyped subcommand gets a "did
// you mean", as a mistyped command does.
func TestSubcommandUsageErrors(t *testing.T) {
	t.Parallel()
	s := startNATS(t) // refused before any coordinator is asked
	nats := []string{"--nats", s.url}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"UnknownFlag", []string{"queue", "ls", "--jsn"}, "queue ls: unknown flag --jsn, did you mean --json? (see `jobbus queue ls --help`)"},
		{"MissingArgument", []string{"queue", "pause"}, "queue pause needs NAME, got 0 argument(s): see `jobbus queue pause --help`"},
		{"StrayArgument", []string{"limit", "ls", "extra"}, "limit ls takes no arguments, got [\"extra\"]: see `jobbus limit ls --help`"},
		{"StrayWord", []string{"workflow", "status", "a", "b"}, "(see `jobbus workflow status --help`)"},
		{"ScheduleFlag", []string{"schedule", "ls", "--jsn"}, "(see `jobbus schedule ls --help`)"},
		{"MistypedQueueCommand", []string{"queue", "pase", "low"}, "did you mean `jobbus queue pause`?"},
		{"MistypedLimitCommand", []string{"limit", "sett", "--type", "X", "--rate", "1/s"}, "did you mean `jobbus limit set`?"},
		{"MistypedWorkflowCommand", []string{"workflow", "stauts", "etl"}, "did you mean `jobbus workflow status`?"},
		{"MistypedScheduleCommand", []string{"schedule", "trigerr", "nightly"}, "did you mean `jobbus schedule trigger`?"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errs := cliRun(nats, tc.args...)
			if code != cli.ExitUsage || !strings.Contains(errs, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errs, cli.ExitUsage, tc.want)
			}
			if out != "" || strings.Count(errs, "\n") != 1 {
				t.Errorf("want one line on stderr and nothing on stdout, got stdout %q stderr %q", out, errs)
			}
			if m := seeHelpRE.FindStringSubmatch(errs); m != nil {
				help := append(strings.Fields(m[1]), "--help")
				if code, _, herrs := cliRun(nil, help...); code != cli.ExitOK {
					t.Errorf("the help it points at, jobbus %s, exits %d: %s", strings.Join(help, " "), code, herrs)
				}
			}
		})
	}
}

// TestLimitSetBurstHelp: limit set's help says that a --burst not given keeps the
// limit's burst; it said "(default: 1)" too, which read as a burst set back to 1.
func TestLimitSetBurstHelp(t *testing.T) {
	t.Parallel()
	code, out, errs := cliRun(nil, "limit", "set", "--help")
	if code != cli.ExitOK {
		t.Fatalf("limit set --help exits %d: %s", code, errs)
	}
	for line := range strings.Lines(out) {
		if strings.HasPrefix(strings.TrimSpace(line), "--burst") {
			if strings.Contains(line, "(default: 1)") || !strings.Contains(line, "current burst") {
				t.Errorf("--burst's help: %q, want the limit's current burst as what it is when not given, and no default of 1", strings.TrimSpace(line))
			}
			return
		}
	}
	t.Fatalf("no --burst in limit set --help:\n%s", out)
}
