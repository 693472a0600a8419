package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

func typesCommand() *cli.Command {
	return &cli.Command{
		Name:  "types",
		Usage: "list the task types: the built-ins and those workers declared",
		Description: `Lists the coordinator's task types: the five built-ins, then every type a worker has
declared (kept in the TASK_TYPES bucket, so they outlive their workers), with the workers
serving each now, its queued and running jobs and its options (default max attempts,
execution timeout, concurrency limit across workers). --schema prints each declared
type's JSON Schema. Declaring types: docs/task-types.md.

Example:
   jobbus types
   jobbus types --json`,
		Flags: []cli.Flag{jsonFlag(),
			&cli.BoolFlag{Name: "schema", Usage: "also print each type's JSON Schema", EnvVars: env("types-schema")}},
		Action: inSession(nil, func(c *cli.Context, s *session, _ []string) error {
			types, err := s.cl.TaskTypes(c.Context)
			if err != nil {
				return exitErr(err)
			}
			return newPrinter(c.App.Writer, c.Bool("json")).taskTypes(types, c.Bool("schema"))
		}),
	}
}

func (p *printer) taskTypes(types []protocol.TaskTypeInfo, schema bool) error {
	if p.json {
		for _, t := range types {
			if err := p.jsonLine(t); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tWORKERS\tQUEUED\tRUNNING\tMAX ATTEMPTS\tTIMEOUT\tCONCURRENCY\tLAST SERVED")
	now := p.now()
	for _, t := range types {
		name, served := t.Name, "-"
		if t.Builtin {
			name += " (built-in)"
		}
		if len(t.Workers) > 0 {
			served = "now"
		} else if t.LastServedMillis > 0 {
			served = ago(now, t.LastServedMillis)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", name, workersOf(t.Workers), t.Queued, t.Running,
			orDefault(t.Options.MaxAttempts), timeoutOf(t.Options.TimeoutMillis), orUnlimited(t.Options.Concurrency), served)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if schema {
		for _, t := range types {
			if len(t.Schema) == 0 {
				continue
			}
			var b bytes.Buffer
			if err := json.Indent(&b, t.Schema, "  ", "  "); err != nil {
				b.Reset()
				b.Write(t.Schema)
			}
			fmt.Fprintf(p.w, "\n%s schema:\n  %s\n", t.Name, b.String())
		}
	}
	return nil
}

func workersOf(ids []string) string {
	switch len(ids) {
	case 0:
		return "-"
	case 1, 2, 3:
		return strings.Join(ids, ",")
	}
	return fmt.Sprintf("%s,%s,... (%d)", ids[0], ids[1], len(ids))
}

func orDefault(n int) string {
	if n <= 0 {
		return "default"
	}
	return fmt.Sprint(n)
}

func orUnlimited(n int) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func timeoutOf(ms int64) string {
	if ms <= 0 {
		return "default"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// serversOf maps each worker id to the task types it serves, from the catalogue; nil
// when the coordinator does not say (a spec server on --connect).
func serversOf(ctx context.Context, cl *client.Client) map[string][]string {
	types, err := cl.TaskTypes(ctx)
	if err != nil {
		return nil
	}
	out := map[string][]string{}
	for _, t := range types {
		for _, w := range t.Workers {
			out[w] = append(out[w], t.Name)
		}
	}
	return out
}

// resolveTaskType finds the task type the user meant: a catalogued name as typed, else
// the one whose name matches in any case with '-' for '_' (text-reverse is
// TEXT_REVERSE), else typed in upper snake case, as the built-ins are spelled.
func resolveTaskType(ctx context.Context, cl *client.Client, typed string) string {
	return findTaskType(ctx, cl, typed, taskName(typed))
}

// findTaskType is the task type typed names: a built-in in any case, a type the
// coordinator knows by that name, or the one whose name matches in any case with '-'
// for '_'; otherwise when none does (or the coordinator cannot say).
func findTaskType(ctx context.Context, cl *client.Client, typed, otherwise string) string {
	norm := taskName(typed)
	if _, builtin := taskFlags[norm]; builtin {
		return norm
	}
	types, err := cl.TaskTypes(ctx)
	if err != nil {
		return otherwise
	}
	var match []string
	for _, t := range types {
		if t.Name == typed {
			return typed
		}
		if taskName(t.Name) == norm {
			match = append(match, t.Name)
		}
	}
	if len(match) == 1 {
		return match[0]
	}
	return otherwise
}

// knownTypes lists the task types that are not built in, for an error's hint.
func knownTypes(ctx context.Context, cl *client.Client) []string {
	types, err := cl.TaskTypes(ctx)
	if err != nil {
		return nil
	}
	var out []string
	for _, t := range types {
		if !t.Builtin {
			out = append(out, t.Name)
		}
	}
	return out
}
