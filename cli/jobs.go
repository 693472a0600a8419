package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/backoff"
)

// clientCommands are the commands that talk to a running coordinator.
func clientCommands() []*cli.Command {
	return []*cli.Command{
		submitCommand(),
		statusCommand(),
		waitCommand(),
		cancelCommand(),
		jobsCommand(),
		workersCommand(),
		typesCommand(),
		queueCommand(),
		watchCommand(),
		logsCommand(), // logs.go
		clusterCommand(),
		workflowCommand(), // workflow.go
		scheduleCommand(),
	}
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:      "status",
		Usage:     "show a job",
		ArgsUsage: "ID",
		Description: `Prints the job's snapshot: state, attempts, worker, progress, result and last error.
With --follow it shows the job live until it ends (a progress bar on a terminal, a line
per change otherwise; with --json a snapshot per change), then prints it; it exits 0
whatever the job's end (jobbus wait exits 1 unless it COMPLETED).

Examples:
   jobbus status 0b7c2f0e-8a41-4d7e-9b43-3f6a1c2d9e10 --json
   jobbus status 0b7c2f0e-8a41-4d7e-9b43-3f6a1c2d9e10 --follow`,
		Flags: []cli.Flag{jsonFlag(),
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "show the job live until it ends", EnvVars: env("follow")}},
		Action: onJob(func(c *cli.Context, s *session, id string) error {
			if c.Bool("follow") {
				return followJob(c, s, id) // progress.go
			}
			job, err := s.cl.Status(c.Context, id)
			if err != nil {
				return exitErr(err)
			}
			return newPrinter(c.App.Writer, c.Bool("json")).job(job)
		}),
	}
}

func waitCommand() *cli.Command {
	return &cli.Command{
		Name:      "wait",
		Usage:     "wait until a job ends",
		ArgsUsage: "ID",
		Description: `Blocks until the job is COMPLETED, FAILED or CANCELLED and prints it. Exits 0 if it
COMPLETED and 1 otherwise, naming its error; also 1 when --timeout passes first.

Example:
   jobbus wait 0b7c2f0e-8a41-4d7e-9b43-3f6a1c2d9e10 --timeout 30s`,
		Flags: []cli.Flag{timeoutFlag("how long to wait"), jsonFlag()},
		Action: onJob(func(c *cli.Context, s *session, id string) error {
			return waitAndShow(c, s, id)
		}),
	}
}

// waitAndShow waits for job id to end, prints it and turns its end into the exit code.
func waitAndShow(c *cli.Context, s *session, id string) error {
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	timeout := c.Duration("timeout")
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var progress func(protocol.Job)
	var sp *spinner
	switch {
	case c.Bool("json"):
	case isTerminal(c.App.ErrWriter):
		sp = &spinner{w: c.App.ErrWriter, start: time.Now()}
		progress = sp.show
	default: // progress.go: a line per change, for a log
		progress = (&progressLines{w: c.App.ErrWriter}).show
	}
	job, err := waitJob(ctx, s.cl, id, progress)
	// The spinner's line goes before anything else is printed: on a terminal, stdout
	// and stderr share the screen, and the result would start on the spinner's line.
	sp.clear()
	switch {
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && c.Context.Err() == nil:
		return cli.Exit(fmt.Sprintf("job %s still %s after %v", id, orUnknown(job.State), timeout), ExitError)
	case err != nil && ctx.Err() != nil:
		return cli.Exit(fmt.Sprintf("stopped waiting for job %s (still %s; it goes on: `jobbus status %s`)", id, orUnknown(job.State), id), ExitError)
	case err != nil:
		return exitErr(err)
	}
	if err := newPrinter(c.App.Writer, c.Bool("json")).job(job); err != nil {
		return err
	}
	if job.State != protocol.StateCompleted {
		msg := fmt.Sprintf("job %s %s", id, job.State)
		if job.Error != nil {
			msg += ": " + *job.Error
		}
		return cli.Exit(msg, ExitError)
	}
	return nil
}

func orUnknown(s protocol.State) string {
	if s == "" {
		return "in an unknown state"
	}
	return string(s)
}

// waitJob polls a job until it is terminal or ctx ends, telling progress each snapshot.
func waitJob(ctx context.Context, cl *client.Client, id string, progress func(protocol.Job)) (protocol.Job, error) {
	var last protocol.Job
	for poll := waitPoll.Start(); ; {
		job, err := cl.Status(ctx, id)
		if err != nil {
			return last, err
		}
		last = job
		if progress != nil {
			progress(job)
		}
		if job.State.Terminal() {
			return job, nil
		}
		if !poll.Wait(ctx) {
			return job, ctx.Err()
		}
	}
}

// waitPoll is how often waitJob asks: soon at first, for a short job.
var waitPoll = backoff.Policy{Base: 5 * time.Millisecond, Max: 250 * time.Millisecond}

// spinner is the progress line of a wait on a terminal.
type spinner struct {
	w     io.Writer
	start time.Time
	frame int
}

var spinFrames = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

func (s *spinner) show(j protocol.Job) {
	s.frame++
	line := fmt.Sprintf("%s job %s %s, attempt %d/%d", spinFrames[s.frame%len(spinFrames)], j.JobID, j.State, j.Attempts, j.MaxAttempts)
	if j.WorkerID != nil {
		line += " on " + *j.WorkerID
	}
	if f, _, ok := jobProgress(j); ok { // progress.go
		line += " " + progressBar(f, 20) + " " + progressText(j)
	}
	line += fmt.Sprintf(" (%.1fs)", time.Since(s.start).Seconds())
	fmt.Fprint(s.w, "\r\x1b[K"+line)
}

// clear erases the spinner's line; a nil spinner (not on a terminal) has none.
func (s *spinner) clear() {
	if s != nil {
		fmt.Fprint(s.w, "\r\x1b[K")
	}
}

func cancelCommand() *cli.Command {
	return &cli.Command{
		Name:      "cancel",
		Usage:     "cancel a job",
		ArgsUsage: "ID",
		Description: `Cancels a QUEUED, RETRY_WAIT or RUNNING job and prints its snapshot. A job that had
already ended keeps its state; the command then says so and still exits 0.
With --json it prints {"cancelled":true|false,"job":{...}}.

Example:
   jobbus cancel 0b7c2f0e-8a41-4d7e-9b43-3f6a1c2d9e10`,
		Flags: []cli.Flag{jsonFlag()},
		Action: onJob(func(c *cli.Context, s *session, id string) error {
			cancelled, job, err := s.cl.Cancel(c.Context, id)
			if err != nil {
				return exitErr(err)
			}
			p := newPrinter(c.App.Writer, c.Bool("json"))
			if p.json {
				return p.jsonLine(struct {
					Cancelled bool         `json:"cancelled"`
					Job       protocol.Job `json:"job"`
				}{cancelled, job})
			}
			if !cancelled {
				fmt.Fprintf(c.App.ErrWriter, "job %s had already ended (%s); nothing to cancel\n", job.JobID, job.State)
			}
			return p.job(job)
		}),
	}
}

func jobsCommand() *cli.Command {
	return &cli.Command{
		Name:    "jobs",
		Aliases: []string{"list"},
		Usage:   "list jobs, newest first",
		Description: `Lists jobs newest first, --limit at a time; when more follow it names the --cursor of
the next page (on stderr). --all follows the cursors to the end.

Examples:
   jobbus jobs --state failed --limit 10
   jobbus jobs --all --json | jq -r 'select(.state=="COMPLETED") | .jobId'`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "state", Usage: "only jobs in this state: " + stateChoices(), EnvVars: env("state")},
			&cli.IntFlag{Name: "limit", Value: 50, Usage: "jobs per page (1..10000)", EnvVars: env("limit")},
			&cli.StringFlag{Name: "cursor", Usage: "start at this page (printed by the previous one)", EnvVars: env("cursor")},
			&cli.BoolFlag{Name: "all", Usage: "follow the cursors: every matching job", EnvVars: env("all")},
			jsonFlag(),
		},
		Action: listJobs,
	}
}

func stateChoices() string {
	names := make([]string, len(protocol.States))
	for i, s := range protocol.States {
		names[i] = strings.ToLower(string(s))
	}
	return strings.Join(names, ", ")
}

func listJobs(c *cli.Context) error {
	if _, err := args(c); err != nil {
		return err
	}
	req := protocol.ListJobs{Limit: c.Int("limit"), Cursor: c.String("cursor")}
	if req.Limit < 1 || req.Limit > 10000 {
		return usageError("--limit must be in 1..10000, got %d", req.Limit)
	}
	if c.IsSet("state") {
		st, err := protocol.ParseState(c.String("state"))
		if err != nil {
			return usageError("--state must be one of %s, got %q", stateChoices(), c.String("state"))
		}
		req.State = &st
	}
	s, err := connect(c, false)
	if err != nil {
		return exitErr(err)
	}
	defer s.Close()
	p := newPrinter(c.App.Writer, c.Bool("json"))
	var jobs []protocol.Job
	for {
		page, err := s.cl.List(c.Context, req)
		if err != nil {
			return exitErr(err)
		}
		jobs = append(jobs, page.Jobs...)
		req.Cursor = page.NextCursor
		if req.Cursor == "" || !c.Bool("all") {
			break
		}
		if p.json { // stream long listings instead of holding them
			if err := p.jobs(jobs); err != nil {
				return err
			}
			jobs = jobs[:0]
		}
	}
	if err := p.jobs(jobs); err != nil {
		return err
	}
	if req.Cursor != "" {
		fmt.Fprintf(c.App.ErrWriter, "more jobs follow: --cursor %s (or --all)\n", req.Cursor)
	}
	return nil
}

func workersCommand() *cli.Command {
	return &cli.Command{
		Name:  "workers",
		Usage: "list the live workers",
		Description: `Lists the workers the coordinator hears from, with their running tasks, capacity and
the task types they serve (TYPES; "built-ins" for the five of PROTOCOL.md).

Example:
   jobbus workers --json`,
		Flags: []cli.Flag{jsonFlag()},
		Action: inSession(nil, func(c *cli.Context, s *session, _ []string) error {
			ws, err := s.cl.Workers(c.Context)
			if err != nil {
				return exitErr(err)
			}
			return newPrinter(c.App.Writer, c.Bool("json")).workersServing(ws, serversOf(c.Context, s.cl))
		}),
	}
}

// onJob is the action of a command on one job: it takes the ID argument, connects,
// and runs do with the session, which it closes after.
func onJob(do func(c *cli.Context, s *session, id string) error) cli.ActionFunc {
	return inSession([]string{"ID"}, func(c *cli.Context, s *session, pos []string) error { return do(c, s, pos[0]) })
}

// inSession is the action of a command that takes the arguments named: it connects,
// and runs do with the session, which it closes after, and the arguments.
func inSession(names []string, do func(c *cli.Context, s *session, pos []string) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		pos, err := args(c, names...)
		if err != nil {
			return err
		}
		s, err := connect(c, false)
		if err != nil {
			return exitErr(err)
		}
		defer s.Close()
		return do(c, s, pos)
	}
}
