package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

func queueCommand() *cli.Command {
	return &cli.Command{
		Name:  "queue",
		Usage: "list, pause, resume and limit the named queues",
		Description: `A job goes to a queue (submit --queue NAME; default "default"), created by its first
use. Workers serve queues by weight or in strict order (worker --queues, --strict-queues).
A paused queue accepts jobs and starts none, until resumed; pause and limits are durable
(they survive restarts and failovers). More: docs/PROTOCOL.md, "Extensions: named queues".

Example:
   jobbus queue ls
   jobbus queue pause low
   jobbus queue resume low
   jobbus queue set low --max-running 20 --key-concurrency 2`,
		Action: unknownSubcommand, // usage.go
		Subcommands: subcommandsWithGlobals("queue", []*cli.Command{
			{
				Name:  "ls",
				Usage: "list the queues: depth, running, unfinished, starts per minute, latency, settings",
				Description: `Lists every queue the coordinator knows, by name: QUEUED is its depth, UNFINISHED
its jobs not finished in any state (QUEUED and RUNNING ones, and those SCHEDULED for
later, WAITING on other jobs or in RETRY_WAIT: a queue with none queued or running may
hold those), RATE the attempts started in the last minute, LATENCY how long its oldest queued job has waited,
THROTTLED the dispatch passes in which a limit held its next job back (since this
coordinator took the lead), WORKERS the live workers serving it.

Example:
   jobbus queue ls
   jobbus queue ls --json`,
				Flags: []cli.Flag{jsonFlag()},
				Action: inSession(nil, func(c *cli.Context, s *session, _ []string) error {
					qs, err := s.cl.Queues(c.Context)
					if err != nil {
						return exitErr(err)
					}
					return newPrinter(c.App.Writer, c.Bool("json")).queues(qs)
				}),
			},
			{
				Name:      "pause",
				Usage:     "pause a queue: it accepts jobs and starts none until resumed",
				ArgsUsage: "NAME",
				Description: `Example:
   jobbus queue pause low`,
				Flags: []cli.Flag{jsonFlag()},
				Action: onQueue(nil, func(c *cli.Context, s *session, name string) (protocol.QueueInfo, error) {
					return s.cl.PauseQueue(c.Context, name)
				}),
			},
			{
				Name:      "resume",
				Usage:     "resume a paused queue",
				ArgsUsage: "NAME",
				Description: `Example:
   jobbus queue resume low`,
				Flags: []cli.Flag{jsonFlag()},
				Action: onQueue(nil, func(c *cli.Context, s *session, name string) (protocol.QueueInfo, error) {
					return s.cl.ResumeQueue(c.Context, name)
				}),
			},
			{
				Name:      "set",
				Usage:     "set a queue's limits (creating the queue if need be)",
				ArgsUsage: "NAME",
				Description: `--max-running bounds the queue's RUNNING jobs across all workers; --key-concurrency
bounds the RUNNING jobs of one concurrency key in the queue (for task types whose options
set no keyConcurrency). 0 removes a limit; a limit not given keeps its value.

Example:
   jobbus queue set low --max-running 20
   jobbus queue set emails --key-concurrency 1`,
				Flags: []cli.Flag{jsonFlag(),
					&cli.IntFlag{Name: "max-running", Usage: "most RUNNING jobs of the queue (0: unbounded)", EnvVars: env("queue-max-running")},
					&cli.IntFlag{Name: "key-concurrency", Usage: "most RUNNING jobs of one concurrency key in the queue (0: unbounded)", EnvVars: env("queue-key-concurrency")},
				},
				Action: onQueue(func(c *cli.Context) error {
					for _, f := range []string{"max-running", "key-concurrency"} {
						if c.IsSet(f) && c.Int(f) < 0 {
							return usageError("--%s must not be negative, got %d", f, c.Int(f))
						}
					}
					if !c.IsSet("max-running") && !c.IsSet("key-concurrency") {
						return usageError("queue set needs --max-running or --key-concurrency")
					}
					return nil
				}, func(c *cli.Context, s *session, name string) (protocol.QueueInfo, error) {
					var set []client.QueueSetting
					if c.IsSet("max-running") {
						set = append(set, client.MaxRunning(c.Int("max-running")))
					}
					if c.IsSet("key-concurrency") {
						set = append(set, client.KeyConcurrency(c.Int("key-concurrency")))
					}
					return s.cl.SetQueue(c.Context, name, set...)
				}),
			},
		}),
	}
}

// onQueue is the action of a command on one queue: it checks the NAME argument (and
// the command's flags, with check) before connecting, runs do and prints the queue as
// it now is.
func onQueue(check func(c *cli.Context) error, do func(c *cli.Context, s *session, name string) (protocol.QueueInfo, error)) cli.ActionFunc {
	return func(c *cli.Context) error {
		pos, err := args(c, "NAME")
		if err != nil {
			return err
		}
		if err := protocol.CheckQueueName(pos[0]); err != nil {
			return usageError("%v", err)
		}
		if check != nil {
			if err := check(c); err != nil {
				return err
			}
		}
		s, err := connect(c, false)
		if err != nil {
			return exitErr(err)
		}
		defer s.Close()
		q, err := do(c, s, pos[0])
		if err != nil {
			return exitErr(err)
		}
		return newPrinter(c.App.Writer, c.Bool("json")).queues([]protocol.QueueInfo{q})
	}
}

func (p *printer) queues(qs []protocol.QueueInfo) error {
	if p.json {
		for _, q := range qs {
			if err := p.jsonLine(q); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tSTATE\tQUEUED\tRUNNING\tUNFINISHED\tRATE\tLATENCY\tKEYS\tWORKERS\tMAX RUNNING\tKEY CONCURRENCY\tSTARTED\tTHROTTLED")
	for _, q := range qs {
		state := "running"
		if q.Paused {
			state = "paused"
		}
		latency := "-"
		if q.LatencyMillis > 0 {
			latency = short(time.Duration(q.LatencyMillis) * time.Millisecond)
			if q.LatencyMillis < 1000 {
				latency = fmt.Sprintf("%dms", q.LatencyMillis)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d/min\t%s\t%d\t%d\t%s\t%s\t%d\t%d\n", q.Name, state, q.Queued, q.Running,
			q.Unfinished, q.StartedPerMinute, latency, q.Keys, q.Workers, orUnlimited(q.MaxRunning), orUnlimited(q.KeyConcurrency), q.Started, q.Throttled)
	}
	return tw.Flush()
}

// queueFlag is submit's --queue.
func queueFlag() cli.Flag {
	return &cli.StringFlag{Name: "queue", Usage: "the job's named queue (default: default)", EnvVars: submitEnv("queue")}
}

// keyConcurrencyFlag is submit's --key-concurrency: the job's concurrency key.
func keyConcurrencyFlag() cli.Flag {
	return &cli.StringFlag{Name: "key-concurrency", Aliases: []string{"concurrency-key"},
		Usage:   "the job's concurrency key (e.g. customer-42): keys take turns, and a queue or task type may bound how many of one key run at once",
		EnvVars: submitEnv("key-concurrency")}
}

// queueOptions adds submit's --queue and --key-concurrency to opts.
func queueOptions(c *cli.Context, opts []client.SubmitOption) ([]client.SubmitOption, error) {
	if c.IsSet("queue") {
		if err := protocol.CheckQueueName(c.String("queue")); err != nil {
			return nil, usageError("--queue: %v", err)
		}
		opts = append(opts, client.Queue(c.String("queue")))
	}
	if c.IsSet("key-concurrency") {
		if err := protocol.CheckConcurrencyKey(c.String("key-concurrency")); err != nil {
			return nil, usageError("--key-concurrency: %v", err)
		}
		opts = append(opts, client.ConcurrencyKey(c.String("key-concurrency")))
	}
	return opts, nil
}
