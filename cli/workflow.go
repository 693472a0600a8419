package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// workflowCommand is `jobbus workflow`: submit, status, cancel and retry a workflow or
// batch.
func workflowCommand() *cli.Command {
	return &cli.Command{
		Name:  "workflow",
		Usage: "submit and follow workflows (DAGs of jobs) and batches",
		Description: `A workflow is a set of named steps, each a job, and the edges between them, submitted at
once and stored all or nothing. A batch is a set of jobs with callbacks (onSuccess,
onComplete). The file is JSON:

   {"workflowId": "etl-2026-12-01",
    "steps": [
      {"name": "extract", "taskType": "SHA256", "payload": {"text": "in"}},
      {"name": "left",    "taskType": "WORD_COUNT", "payload": {"text": "a b"}, "after": ["extract"]},
      {"name": "right",   "taskType": "WORD_COUNT", "payload": {"text": "c"},   "after": ["extract"]},
      {"name": "load",    "taskType": "SHA256", "payload": {"text": "out"}, "after": ["left", "right"]}]}

Edges may also be given apart ("edges": [["extract", "left"], ...]), and a chain in short:
"chain": "a -> b -> c". A batch: {"kind": "batch", "steps": [...], "onSuccess": {...},
"onComplete": {...}}; onComplete's payload gets "batch": {total, completed, failed, cancelled}.`,
		Action: unknownSubcommand, // usage.go
		Subcommands: subcommandsWithGlobals("workflow", []*cli.Command{
			{
				Name:      "submit",
				Usage:     "submit a workflow or batch from FILE.json (- reads stdin)",
				ArgsUsage: "FILE.json|-",
				Description: `Prints the workflow's id and each step's job id. Nothing is stored if anything in the file
is refused (a cycle, an unknown step, a bad payload: the message names the step).
With --wait it blocks until no step is active and exits 0 if the workflow COMPLETED.

Examples:
   jobbus workflow submit etl.json --wait
   echo '{"steps":[{"name":"a","taskType":"SHA256","payload":{"text":"x"}},{"name":"b","taskType":"SHA256","payload":{"text":"y"}}],"chain":"a -> b"}' | jobbus workflow submit -`,
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "id", Usage: "the workflow's id, instead of the file's (or one the coordinator picks)", EnvVars: env("workflow-id")},
					&cli.BoolFlag{Name: "wait", Usage: "wait until no step is active; exit 0 if the workflow COMPLETED", EnvVars: env("wait")},
					timeoutFlag("with --wait, how long to wait"),
					jsonFlag(),
				},
				Action: inSession([]string{"FILE.json|-"}, workflowSubmit),
			},
			{
				Name:      "status",
				Usage:     "show a workflow's or batch's state and each step's",
				ArgsUsage: "ID",
				Description: `Example:
   jobbus workflow status etl-2026-12-01`,
				Flags:  []cli.Flag{jsonFlag()},
				Action: inSession([]string{"ID"}, workflowStatus),
			},
			{
				Name:      "cancel",
				Usage:     "cancel every step of a workflow not yet ended",
				ArgsUsage: "ID",
				Description: `Example:
   jobbus workflow cancel etl-2026-12-01`,
				Flags: []cli.Flag{jsonFlag()},
				Action: inSession([]string{"ID"}, func(c *cli.Context, s *session, pos []string) error {
					r, err := s.cl.CancelWorkflowRequest(c.Context, pos[0])
					if err != nil {
						return exitErr(err)
					}
					p := newPrinter(c.App.Writer, c.Bool("json"))
					if p.json {
						type plain protocol.WorkflowCancelled
						return p.jsonLine(plain(r))
					}
					_, err = fmt.Fprintf(p.w, "%s %s: %d steps cancelled\n", groupKind(r.Kind), pos[0], r.Cancelled)
					return err
				}),
			},
			{
				Name:      "retry",
				Usage:     "run again the failed and cancelled steps of an ended workflow",
				ArgsUsage: "ID",
				Description: `Each step that failed or was cancelled (the steps after a failed one are) runs again as a
new job, after the steps it waits for; completed steps are kept. A workflow whose steps
all completed has nothing to retry: it says so and exits 0.

Example:
   jobbus workflow retry etl-2026-12-01`,
				Flags: []cli.Flag{jsonFlag()},
				Action: inSession([]string{"ID"}, func(c *cli.Context, s *session, pos []string) error {
					r, err := s.cl.RetryWorkflowRequest(c.Context, pos[0])
					if err != nil {
						return exitErr(err)
					}
					p := newPrinter(c.App.Writer, c.Bool("json"))
					if p.json {
						type plain protocol.WorkflowRetried
						return p.jsonLine(plain{WorkflowID: pos[0], Jobs: r.Jobs, Kind: r.Kind})
					}
					if len(r.Jobs) == 0 {
						// The coordinator refuses a workflow with a step still active or
						// gone, and runs again each one that failed or was cancelled:
						// nothing run again means all completed. A no-op, not an error.
						_, err = fmt.Fprintf(p.w, "%s %s: nothing to retry: every step COMPLETED\n", groupKind(r.Kind), pos[0])
						return err
					}
					return printStepJobs(p.w, groupKind(r.Kind), pos[0], r.Jobs)
				}),
			},
		}),
	}
}

// readWorkflow reads a SUBMIT_WORKFLOW from a file or stdin, with "chain" as an
// array or an "a -> b -> c" string.
func readWorkflow(name string, stdin io.Reader) (*protocol.SubmitWorkflow, error) {
	var data []byte
	var err error
	if name == "-" {
		data, err = io.ReadAll(io.LimitReader(stdin, protocol.MaxMessage+1))
	} else {
		data, err = os.ReadFile(name)
	}
	if err != nil {
		return nil, usageError("read workflow: %v", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, usageError("workflow %s is not a JSON object: %v", name, err)
	}
	if ch, ok := raw["chain"]; ok {
		var s string
		if json.Unmarshal(ch, &s) == nil {
			var names []string
			for _, n := range strings.Split(s, "->") {
				names = append(names, strings.TrimSpace(n))
			}
			raw["chain"], _ = json.Marshal(names)
		}
	}
	delete(raw, "type")
	data, _ = json.Marshal(raw)
	var req protocol.SubmitWorkflow
	d := json.NewDecoder(strings.NewReader(string(data)))
	d.DisallowUnknownFields()
	if err := d.Decode(&req); err != nil {
		return nil, usageError("workflow %s: %v", name, err)
	}
	return &req, nil
}

func workflowSubmit(c *cli.Context, s *session, pos []string) error {
	if err := timeoutNeedsWait(c, "workflow"); err != nil {
		return err
	}
	req, err := readWorkflow(pos[0], os.Stdin)
	if err != nil {
		return err
	}
	if c.IsSet("id") {
		if err := protocol.ValidWorkflowID(c.String("id")); err != nil {
			return usageError("--id: %v", err)
		}
		req.WorkflowID = c.String("id")
	}
	kind := groupKind(req.Kind)
	out, err := s.cl.SubmitWorkflowRequest(c.Context, req)
	if err != nil {
		return exitErr(fmt.Errorf("submit %s: %w", kind, err))
	}
	p := newPrinter(c.App.Writer, c.Bool("json"))
	if !c.Bool("wait") {
		if p.json {
			type plain protocol.WorkflowSubmitted
			return p.jsonLine(plain(out))
		}
		return printStepJobs(p.w, kind, out.WorkflowID, out.Jobs)
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if t := c.Duration("timeout"); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	st, err := s.cl.WaitWorkflow(ctx, out.WorkflowID)
	if err != nil {
		return cli.Exit(fmt.Sprintf("stopped waiting for %s %s (%v; it goes on: `jobbus workflow status %s`)", kind, out.WorkflowID, err, out.WorkflowID), ExitError)
	}
	if err := p.workflow(st); err != nil {
		return err
	}
	if st.State != string(protocol.StateCompleted) {
		return cli.Exit("", ExitError)
	}
	return nil
}

func workflowStatus(c *cli.Context, s *session, pos []string) error {
	st, err := s.cl.WorkflowStatus(c.Context, pos[0])
	if err != nil {
		return exitErr(err)
	}
	return newPrinter(c.App.Writer, c.Bool("json")).workflow(st)
}

// groupKind is what a workflow or batch of kind is called: kind, or "workflow" when
// none is said (a coordinator that did not say, a file without "kind").
func groupKind(kind string) string {
	if kind == "" {
		return protocol.KindWorkflow
	}
	return kind
}

// printStepJobs prints a workflow's or batch's kind and id and its steps' jobs, by
// step name.
func printStepJobs(w io.Writer, kind, id string, jobs map[string]string) error {
	fmt.Fprintf(w, "%s %s\n", kind, id)
	names := make([]string, 0, len(jobs))
	for n := range jobs {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, n := range names {
		fmt.Fprintf(tw, "%s\t%s\n", n, jobs[n])
	}
	return tw.Flush()
}

// workflow prints a workflow's state, its counts and a table of its steps.
func (p *printer) workflow(st protocol.WorkflowStatus) error {
	if p.json {
		type plain protocol.WorkflowStatus // without the message's "type"
		return p.jsonLine(plain(st))
	}
	var counts []string
	for _, s := range protocol.States {
		if n := st.Counts[s]; n > 0 {
			counts = append(counts, fmt.Sprintf("%d %s", n, s))
		}
	}
	fmt.Fprintf(p.w, "%s %s: %s (%s)\n", st.Kind, st.WorkflowID, st.State, strings.Join(counts, ", "))
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tSTATE\tJOB\tAFTER\tERROR")
	for _, s := range st.Steps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, p.state(s.State), s.JobID, orDashString(strings.Join(s.After, ",")), oneLine(orDash(s.Error)))
	}
	if st.Truncated {
		fmt.Fprintln(tw, "...\t(more steps: see --json or the counts)\t\t\t")
	}
	return tw.Flush()
}

func orDashString(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// workflowRows are a job's rows about what it waits for and which workflow it is in.
func workflowRows(j protocol.Job) [][2]string {
	var rows [][2]string
	if len(j.After) > 0 {
		rows = append(rows, [2]string{"AFTER", strings.Join(j.After, ",")})
	}
	if j.WorkflowID != "" {
		rows = append(rows, [2]string{"WORKFLOW", j.WorkflowID + " (step " + j.Step + ")"})
	}
	if j.BatchID != "" {
		rows = append(rows, [2]string{"BATCH", j.BatchID + " (" + j.Step + ")"})
	}
	return rows
}

// afterOptions are submit's --after and --after-any-end.
func afterOptions(c *cli.Context) ([]client.SubmitOption, error) {
	var ids []string
	if c.IsSet("after") {
		for _, id := range strings.Split(c.String("after"), ",") {
			if id = strings.TrimSpace(id); id == "" {
				// Most often a shell variable that was never set, as `--after "$parent"`
				// in a new terminal: dropped, the job would run at once, not after it.
				return nil, usageError("--after %q names an empty job id (a shell variable that is not set?): give ID[,ID...]", c.String("after"))
			}
			ids = append(ids, id)
		}
	}
	if c.Bool("after-any-end") && len(ids) == 0 {
		return nil, usageError("--after-any-end needs --after ID[,ID...]")
	}
	if len(ids) == 0 {
		return nil, nil
	}
	opts := []client.SubmitOption{client.After(ids...)}
	if c.Bool("after-any-end") {
		opts = append(opts, client.AfterAnyEnd())
	}
	return opts, nil
}

// afterFlagHint has the refusal of a job after a parent that failed name the flag that
// runs it anyway, --after-any-end, where the coordinator names the wire's field.
func afterFlagHint(err error) error {
	msg := err.Error()
	var se *client.ServerError
	if !errors.As(err, &se) || !strings.HasSuffix(msg, protocol.AfterAnyEndHint) {
		return err
	}
	return reworded{err, strings.TrimSuffix(msg, protocol.AfterAnyEndHint) + " (add --after-any-end to run it anyway)"}
}

// reworded is an error said otherwise, still wrapping it.
type reworded struct {
	err error
	msg string
}

func (r reworded) Error() string { return r.msg }
func (r reworded) Unwrap() error { return r.err }

// afterFlags are submit's flags of dependencies.
func afterFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "after", Usage: "wait (WAITING) until these jobs COMPLETED: ID[,ID...]; cancelled if one fails", EnvVars: submitEnv("after")},
		&cli.BoolFlag{Name: "after-any-end", Usage: "with --after: run once they ended, whatever way", EnvVars: submitEnv("after-any-end")},
	}
}
