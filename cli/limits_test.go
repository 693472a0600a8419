package cli_test

import (
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
)

// TestLimitCommands: jobbus limit set, ls and rm, over both transports.
func TestLimitCommands(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		out, _ := o.mustRun(cli.ExitOK, "limit", "set", "--type", "sha256", "--rate", "100/m", "--burst", "10")
		if !strings.Contains(out, "LIMIT") || !strings.Contains(out, "type SHA256") || !strings.Contains(out, "100/m") || !strings.Contains(out, "10.00") {
			t.Fatalf("limit set printed %q, want the limit's state: type SHA256, 100/m, 10 tokens", out)
		}
		o.mustRun(cli.ExitOK, "limit", "set", "--queue", "low", "--rate", "5/s")
		out, _ = o.mustRun(cli.ExitOK, "limit", "ls", "--json")
		infos := jsonLines[protocol.LimitInfo](t, out)
		if len(infos) != 2 || infos[0].Scope != "queue" || infos[0].Name != "low" || infos[0].Burst != 1 ||
			infos[1].Name != "SHA256" || infos[1].Rate != "100/m" || infos[1].Burst != 10 || infos[1].PerSecond < 1.66 || infos[1].PerSecond > 1.67 {
			t.Fatalf("limit ls --json: %+v", infos)
		}
		// Lowered to 1/h with burst 2: the bucket keeps 2 of its tokens, so two jobs
		// start and the third waits QUEUED.
		o.mustRun(cli.ExitOK, "limit", "set", "--type", "SHA256", "--rate", "1/h", "--burst", "2")
		for range 2 {
			o.mustRun(cli.ExitOK, "submit", "SHA256", "--text", "x", "--wait")
		}
		id, _ := o.mustRun(cli.ExitOK, "submit", "SHA256", "--text", "third")
		out, _ = o.mustRun(cli.ExitOK, "status", "--json", strings.TrimSpace(id))
		if j := jsonJob(t, out); j.State != protocol.StateQueued {
			t.Fatalf("the third job: %+v, want QUEUED (1/h, burst 2)", j)
		}
		out, _ = o.mustRun(cli.ExitOK, "limit", "ls")
		if !strings.Contains(out, "NEXT TOKEN") || !strings.Contains(out, "in 59m") {
			t.Fatalf("limit ls printed %q, want the next token in 59m...", out)
		}
		out, _ = o.mustRun(cli.ExitOK, "limit", "rm", "--type", "SHA256")
		if strings.TrimSpace(out) != "removed the limit of type SHA256 (1/h, burst 2)" {
			t.Fatalf("limit rm printed %q", out)
		}
		o.mustRun(cli.ExitOK, "wait", strings.TrimSpace(id))
		_, errs := o.mustRun(cli.ExitError, "limit", "rm", "--type", "SHA256")
		if !strings.Contains(errs, "Unknown limit: type SHA256") {
			t.Fatalf("rm of a limit not set: %q", errs)
		}
	})
}

// TestLimitUsageErrors: a limit that cannot be set exits 2 with what is wrong.
func TestLimitUsageErrors(t *testing.T) {
	t.Parallel()
	s := setup(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"limit", "set", "--type", "SHA256"}, "limit set needs --rate COUNT/PERIOD"},
		{[]string{"limit", "set", "--rate", "1/s"}, "needs --type TASK_TYPE or --queue NAME"},
		{[]string{"limit", "set", "--type", "SHA256", "--queue", "q", "--rate", "1/s"}, "takes --type or --queue, not both"},
		{[]string{"limit", "set", "--type", "SHA256", "--rate", "0/s"}, "rate count must be positive, got 0"},
		{[]string{"limit", "set", "--type", "SHA256", "--rate", "-3/m"}, "rate count must be positive, got -3"},
		{[]string{"limit", "set", "--type", "SHA256", "--rate", "5/fortnight"}, `unknown unit "fortnight"`},
		{[]string{"limit", "set", "--type", "SHA256", "--rate", "lots"}, "must be COUNT/PERIOD"},
		{[]string{"limit", "set", "--type", "SHA256", "--rate", "1/s", "--burst", "0"}, "--burst must be 1 to 100000, got 0"},
		{[]string{"limit", "set", "--queue", "a b", "--rate", "1/s"}, `queue name "a b" must be`},
		{[]string{"limit", "rm"}, "needs --type TASK_TYPE or --queue NAME"},
		{[]string{"submit", "SHA256", "--text", "x", "--unique-while", "forever"}, `--unique-while must be "active"`},
		{[]string{"submit", "SHA256", "--text", "x", "--unique-for", "-1s"}, "--unique-for must be positive"},
		{[]string{"submit", "SHA256", "--text", "x", "--unique-for", "1h", "--unique-while", "active"}, "--unique-for and --unique-while cannot be combined"},
	}
	for _, tc := range cases {
		code, _, errs := s.run(tc.args...)
		if code != cli.ExitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("jobbus %s: exit %d, stderr %q; want %d and %q", strings.Join(tc.args, " "), code, errs, cli.ExitUsage, tc.want)
		}
	}
	if code, out, _ := s.run("limit", "ls", "--json"); code != cli.ExitOK || out != "" {
		t.Fatalf("after the refusals, limit ls: exit %d %q, want no limit", code, out)
	}
}

// TestSubmitUnique: --unique-for and --unique-while active answer a repeat of the same
// work with the first job's id.
func TestSubmitUnique(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		a, _ := o.mustRun(cli.ExitOK, "submit", "sha256", "--text", "once an hour", "--unique-for", "1h")
		b, _ := o.mustRun(cli.ExitOK, "submit", "SHA256", "--payload", `{"text": "once an hour"}`, "--unique-for", "1h")
		if a != b {
			t.Errorf("unique for an hour: %q then %q", a, b)
		}
		c, _ := o.mustRun(cli.ExitOK, "submit", "SLEEP", "--milliseconds", "600000", "--unique-while", "active")
		d, _ := o.mustRun(cli.ExitOK, "submit", "SLEEP", "--milliseconds", "600000", "--unique-while", "active")
		if c != d {
			t.Errorf("unique while active: %q then %q", c, d)
		}
		o.mustRun(cli.ExitOK, "cancel", strings.TrimSpace(c))
		e, _ := o.mustRun(cli.ExitOK, "submit", "SLEEP", "--milliseconds", "600000", "--unique-while", "active")
		if e == c {
			t.Errorf("unique while active, after it ended: the same job %q", e)
		}
		o.mustRun(cli.ExitOK, "cancel", strings.TrimSpace(e))
	})
}
