package cli_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tasks"
)

type reverseArgs struct {
	Text string `json:"text" jsonschema:"maxLength=10"`
}

// startFunctionWorker runs a worker serving TEXT_REVERSE only, with a concurrency
// limit of 2, and waits until the coordinator lists it.
func (s *system) startFunctionWorker(id string) {
	s.t.Helper()
	s.StartFunctionWorker(s.t, func(w *worker.Worker) error {
		return worker.HandleJSON(w, "TEXT_REVERSE", func(_ context.Context, _ int, a reverseArgs) (string, error) {
			r := []rune(a.Text)
			slices.Reverse(r)
			return string(r), nil
		}, worker.Concurrency(2), worker.MaxAttempts(4))
	}, worker.WithID(id), worker.WithTasks(tasks.NewRegistry()))
	eventually(s.t, "worker "+id+" listed", func() bool {
		_, out, _ := s.run("workers", "--json")
		return strings.Contains(out, id)
	})
}

// TestCustomTaskTypes: submit takes any declared type (in any case, kebab-case too)
// with --payload, its schema's errors come back as they are, and types and workers show
// the catalogue, over NATS and over the TCP client port.
func TestCustomTaskTypes(t *testing.T) {
	t.Parallel()
	forEachTransport(t, func(t *testing.T, o over) {
		o.startFunctionWorker("fn-1")
		for _, typed := range []string{"TEXT_REVERSE", "text-reverse"} {
			out, _ := o.mustRun(cli.ExitOK, "submit", typed, "--payload", `{"text":"héllo"}`, "--wait", "--json")
			if j := jsonJob(t, out); j.TaskType != "TEXT_REVERSE" || j.Result == nil || *j.Result != "olléh" || j.MaxAttempts != 4 {
				t.Errorf("submit %s ran as %+v", typed, j)
			}
		}
		_, errs := o.mustRun(cli.ExitError, "submit", "TEXT_REVERSE", "--payload", `{"text":"far too long"}`)
		if !strings.Contains(errs, "Invalid payload: at '/text': maxLength: got 12, want 10") {
			t.Errorf("stderr %q", errs)
		}
		_, errs = o.mustRun(cli.ExitError, "submit", "resize", "--payload", `{}`)
		if !strings.Contains(errs, "Unknown task type: RESIZE (built-in tasks: FAIL, PRIME_COUNT, SHA256, SLEEP, WORD_COUNT; declared by workers: TEXT_REVERSE)") {
			t.Errorf("stderr %q", errs)
		}

		out, _ := o.mustRun(cli.ExitOK, "types", "--json")
		types := jsonLines[protocol.TaskTypeInfo](t, out)
		names := make([]string, len(types))
		for i, ti := range types {
			names[i] = ti.Name
		}
		if want := []string{"FAIL", "PRIME_COUNT", "SHA256", "SLEEP", "WORD_COUNT", "TEXT_REVERSE"}; !slices.Equal(names, want) {
			t.Fatalf("types %v, want %v", names, want)
		}
		if tr := types[5]; tr.Builtin || !slices.Equal(tr.Workers, []string{"fn-1"}) || tr.Options.Concurrency != 2 || tr.Options.MaxAttempts != 4 {
			t.Errorf("TEXT_REVERSE %+v", tr)
		}
		out, _ = o.mustRun(cli.ExitOK, "types")
		if !strings.Contains(out, "TEXT_REVERSE") || !strings.Contains(out, "CONCURRENCY") || !strings.Contains(out, "SHA256 (built-in)") {
			t.Errorf("types table:\n%s", out)
		}

		out, _ = o.mustRun(cli.ExitOK, "workers")
		if !strings.Contains(out, "TYPES") || !strings.Contains(out, "fn-1") || !strings.Contains(out, "built-ins") {
			t.Errorf("workers table:\n%s", out)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "fn-1") && !strings.HasSuffix(strings.TrimSpace(line), "TEXT_REVERSE") {
				t.Errorf("fn-1's row %q, want its TEXT_REVERSE", line)
			}
		}
	})
}
