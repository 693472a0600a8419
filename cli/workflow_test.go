package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "wf.json")
	if err := os.WriteFile(name, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestWorkflowCommands(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		file := writeFile(t, `{"workflowId":"etl","steps":[
			{"name":"extract","taskType":"SHA256","payload":{"text":"in"}},
			{"name":"left","taskType":"WORD_COUNT","payload":{"text":"a b"},"after":["extract"]},
			{"name":"right","taskType":"WORD_COUNT","payload":{"text":"c"},"after":["extract"]},
			{"name":"load","taskType":"SHA256","payload":{"text":"out"},"after":["left","right"]}]}`)
		out, _ := o.mustRun(cli.ExitOK, "workflow", "submit", file, "--wait", "--json")
		st := jsonLines[protocol.WorkflowStatus](t, out)
		if len(st) != 1 || st[0].State != "COMPLETED" || len(st[0].Steps) != 4 || st[0].Steps[3].Name != "load" {
			t.Fatalf("workflow submit --wait printed %s", out)
		}
		out, _ = o.mustRun(cli.ExitOK, "workflow", "status", "etl")
		for _, want := range []string{"workflow etl: COMPLETED (4 COMPLETED)", "load", "left,right"} {
			if !strings.Contains(out, want) {
				t.Errorf("workflow status lacks %q:\n%s", want, out)
			}
		}
		// Nothing failed: a retry is a no-op, not an error, and says so.
		out, _ = o.mustRun(cli.ExitOK, "workflow", "retry", "etl")
		if want := "workflow etl: nothing to retry: every step COMPLETED\n"; out != want {
			t.Errorf("retry of a completed workflow printed %q, want %q", out, want)
		}
		out, _ = o.mustRun(cli.ExitOK, "status", st[0].Steps[3].JobID)
		if !strings.Contains(out, "WORKFLOW  etl (step load)") {
			t.Errorf("status of a step lacks its workflow:\n%s", out)
		}

		chain := writeFile(t, `{"workflowId":"ch","steps":[{"name":"a","taskType":"SHA256","payload":{"text":"a"}},
			{"name":"b","taskType":"FAIL","payload":{"failUntilAttempt":5},"maxAttempts":1},
			{"name":"c","taskType":"SHA256","payload":{"text":"c"}}],"chain":"a -> b -> c"}`)
		_, errs := o.mustRun(cli.ExitError, "workflow", "submit", chain, "--wait")
		_ = errs
		out, _ = o.mustRun(cli.ExitOK, "workflow", "status", "ch", "--json")
		if s := jsonLines[protocol.WorkflowStatus](t, out)[0]; s.State != "FAILED" || s.Steps[2].State != protocol.StateCancelled ||
			!strings.Contains(*s.Steps[2].Error, "parent step b") {
			t.Fatalf("chain status %+v, want FAILED with c cancelled naming b", s)
		}
		out, _ = o.mustRun(cli.ExitOK, "workflow", "retry", "ch")
		if !strings.Contains(out, "workflow ch") || !strings.Contains(out, "b ") || !strings.Contains(out, "c ") {
			t.Errorf("retry printed %q, want b and c's new jobs", out)
		}

		bad := writeFile(t, `{"steps":[{"name":"a","taskType":"SHA256","payload":{"text":"a"},"after":["b"]},{"name":"b","taskType":"SHA256","payload":{"text":"b"},"after":["a"]}]}`)
		_, errs = o.mustRun(cli.ExitError, "workflow", "submit", bad)
		if !strings.Contains(errs, "is on a cycle") {
			t.Errorf("a cycle: %q", errs)
		}
		one := writeFile(t, `{"steps":[{"name":"a","taskType":"SHA256","payload":{"text":"a"}}]}`)
		_, errs = o.mustRun(cli.ExitUsage, "workflow", "submit", "--id", "no way", one)
		if !strings.Contains(errs, `--id: workflow id "no way" must be`) {
			t.Errorf("a bad --id: %q, want it named", errs)
		}

		sleep := writeFile(t, `{"workflowId":"zz","steps":[{"name":"a","taskType":"SLEEP","payload":{"durationMillis":60000}},{"name":"b","taskType":"SHA256","payload":{"text":"b"},"after":["a"]}]}`)
		o.mustRun(cli.ExitOK, "workflow", "submit", sleep)
		out, _ = o.mustRun(cli.ExitOK, "workflow", "cancel", "zz")
		if !strings.Contains(out, "2 steps cancelled") {
			t.Errorf("cancel printed %q", out)
		}

		// --after: a job that waits for another.
		first, _ := o.mustRun(cli.ExitOK, "submit", "sha256", "--text", "1")
		out, _ = o.mustRun(cli.ExitOK, "submit", "sha256", "--text", "2", "--after", strings.TrimSpace(first), "--wait", "--json")
		if j := jsonJob(t, out); j.State != protocol.StateCompleted || len(j.After) != 1 {
			t.Errorf("job after another: %+v", j)
		}
		_, errs = o.mustRun(cli.ExitError, "submit", "sha256", "--text", "3", "--after", "0b5b7d4c-1111-4111-8111-111111111111")
		if !strings.Contains(errs, "Unknown parent job") {
			t.Errorf("after an unknown job: %q", errs)
		}
		o.mustRun(cli.ExitUsage, "submit", "sha256", "--text", "3", "--after-any-end")

		// After a parent that failed: the refusal names the CLI's flag, not the wire's field.
		failed, _ := o.mustRun(cli.ExitError, "submit", "fail", "--fail-until-attempt", "5", "--max-attempts", "1", "--wait", "--json")
		_, errs = o.mustRun(cli.ExitError, "submit", "sha256", "--text", "4", "--after", jsonJob(t, failed).JobID)
		if !strings.Contains(errs, "ended FAILED") || !strings.Contains(errs, "--after-any-end") || strings.Contains(errs, "afterAnyEnd") {
			t.Errorf("after a failed job: %q, want the hint to name --after-any-end", errs)
		}
	})
}

// TestWorkflowGlobalsAfterName: the global flags go after a workflow command's name
// too, as after every other command's (docs/operations.md): `jobbus workflow submit
// etl.json --wait --nats URL` is not refused as if --nats did not apply.
func TestWorkflowGlobalsAfterName(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		file := writeFile(t, `{"workflowId":"after","steps":[{"name":"a","taskType":"SHA256","payload":{"text":"a"}}]}`)
		global := o.tr.flags(o.system)
		run := func(want int, args ...string) string {
			t.Helper()
			code, out, errs := cliRun(nil, append(args, global...)...)
			if code != want {
				t.Fatalf("jobbus %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(append(args, global...), " "), code, want, out, errs)
			}
			return out
		}
		out := run(cli.ExitOK, "workflow", "submit", file, "--wait", "--json")
		if st := jsonLines[protocol.WorkflowStatus](t, out); len(st) != 1 || st[0].State != "COMPLETED" {
			t.Fatalf("workflow submit --wait printed %s", out)
		}
		run(cli.ExitOK, "workflow", "status", "after")
		run(cli.ExitOK, "workflow", "cancel", "after")
		run(cli.ExitOK, "workflow", "retry", "after")
	})
}

// TestBatchCommandsSayBatch: jobbus workflow submit, retry and cancel of a batch name it
// a batch, as its status does: they said "workflow" of it (a retry refused while it
// runs, the cancel's and the retry's answers, the submission's).
func TestBatchCommandsSayBatch(t *testing.T) {
	t.Parallel()
	s := setup(t)
	file := writeFile(t, `{"kind":"batch","workflowId":"bt","steps":[
		{"name":"nap","taskType":"SLEEP","payload":{"durationMillis":60000}},
		{"name":"sum","taskType":"SHA256","payload":{"text":"x"}}]}`)
	run := func(want int, args ...string) (string, string) {
		t.Helper()
		code, out, errs := s.run(args...)
		if code != want {
			t.Fatalf("jobbus %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out, errs)
		}
		return out, errs
	}
	out, _ := run(cli.ExitOK, "workflow", "submit", file)
	if !strings.HasPrefix(out, "batch bt\n") {
		t.Errorf("submit of a batch printed %q, want it to begin %q", out, "batch bt\n")
	}
	_, errs := run(cli.ExitError, "workflow", "retry", "bt")
	if !strings.Contains(errs, "batch bt still runs") || strings.Contains(errs, "workflow") {
		t.Errorf("retry of a running batch said %q, want it to say %q", errs, "batch bt still runs")
	}
	out, _ = run(cli.ExitOK, "workflow", "cancel", "bt")
	if !strings.HasPrefix(out, "batch bt: ") || !strings.Contains(out, "cancelled") {
		t.Errorf("cancel of a batch printed %q, want it to begin %q", out, "batch bt: ")
	}
	out, _ = run(cli.ExitOK, "workflow", "retry", "bt")
	if !strings.HasPrefix(out, "batch bt\n") || !strings.Contains(out, "nap") {
		t.Errorf("retry of a batch printed %q, want it to begin %q and name the step nap", out, "batch bt\n")
	}
	run(cli.ExitOK, "workflow", "cancel", "bt")
}
