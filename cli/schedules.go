package cli

import (
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// scheduleEnv names a flag of `schedule add`: JOBBUS_SCHEDULE_<FLAG>, apart from
// submit's variables.
func scheduleEnv(flag string) []string { return env("schedule-" + flag) }

func scheduleCommand() *cli.Command {
	return &cli.Command{
		Name:  "schedule",
		Usage: "named, durable, periodic submissions: add, ls, pause, resume, rm, trigger",
		Description: `A schedule submits a job of its task type at each of its ticks: every --every, or at the
times of a --cron spec (6 fields with seconds, read in --tz). The leading coordinator keeps
schedules durably and ticks them whoever leads: exactly one job per tick, across restarts
and failovers. Ticks that pass while no coordinator runs are caught up by --catch-up.

Examples:
   jobbus schedule add heartbeat --every 30s sha256 --text ping
   jobbus schedule add nightly --cron "0 0 3 * * *" --tz Europe/Berlin PRIME_COUNT --limit 1000000
   jobbus schedule ls
   jobbus schedule pause nightly
   jobbus schedule trigger nightly`,
		Subcommands: withScheduleGlobals([]*cli.Command{
			scheduleAddCommand(),
			scheduleListCommand(),
			scheduleNameCommand("pause", "pause a schedule: no ticks until resume", "Ticks that pass while paused are not caught up.",
				func(c *cli.Context, cl *client.Client, name string) (protocol.Schedule, error) {
					return cl.PauseSchedule(c.Context, name)
				}),
			scheduleNameCommand("resume", "resume a paused schedule", "Its ticks count again from now.",
				func(c *cli.Context, cl *client.Client, name string) (protocol.Schedule, error) {
					return cl.ResumeSchedule(c.Context, name)
				}),
			scheduleNameCommand("rm", "remove a schedule", "Its jobs stay; no further ones are submitted.",
				func(c *cli.Context, cl *client.Client, name string) (protocol.Schedule, error) {
					return cl.RemoveSchedule(c.Context, name)
				}),
			scheduleTriggerCommand(),
		}),
		Action: unknownSubcommand, // usage.go
	}
}

// withScheduleGlobals gives each schedule command the client commands' global flags
// after its name too, as withGlobalFlags does for the top-level commands.
func withScheduleGlobals(cmds []*cli.Command) []*cli.Command {
	uses := slices.Concat(natsGlobals, connectGlobal)
	for _, cmd := range cmds {
		for _, g := range globalFlags() {
			if slices.Contains(uses, g.Names()[0]) {
				cmd.Flags = append(cmd.Flags, g)
			}
		}
		cmd.OnUsageError = onUsageError
	}
	return cmds
}

func scheduleAddCommand() *cli.Command {
	return &cli.Command{
		Name:      "add",
		Usage:     "add a schedule",
		ArgsUsage: "NAME TASK",
		Description: `Adds schedule NAME, which submits a job of TASK at each tick: every --every (counted from
now), or at the times of --cron, 6 fields "second minute hour day-of-month month
day-of-week" (or @hourly, @daily, ...) read in --tz (default UTC). The payload is the task
flag or --payload, as for submit; the coordinator checks it as it checks a submission and
refuses the schedule if a submission would be refused. Each tick's job carries the
idempotency key schedule:NAME:<tick in Unix ms>, so a restart or a failover in the middle
of a tick cannot submit it twice.
--catch-up says what happens to the ticks that passed while no coordinator ran: none skips
them, one (the default) runs the latest once, all runs each.

Examples:
   jobbus schedule add heartbeat --every 30s sha256 --text ping
   jobbus schedule add report --cron "0 */5 * * * *" WORD_COUNT --text "a b c" --catch-up all
   jobbus schedule add nightly --cron "0 0 3 * * *" --tz Europe/Berlin TEXT_REVERSE --payload '{"text":"x"}'`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "every", Usage: "a tick every this long (30s, 5m, 1h; at least 1s)", EnvVars: scheduleEnv("every")},
			&cli.StringFlag{Name: "cron", Usage: `a tick at the times of this 6-field spec with seconds ("0 */5 * * * *")`, EnvVars: scheduleEnv("cron")},
			&cli.StringFlag{Name: "tz", Usage: "with --cron: the time zone it is read in (an IANA name such as Europe/Berlin; default UTC)", EnvVars: scheduleEnv("tz")},
			&cli.StringFlag{Name: "catch-up", Value: "one", Usage: "ticks missed while no coordinator ran: none, one or all", EnvVars: scheduleEnv("catch-up")},
			&cli.Int64Flag{Name: "milliseconds", Usage: "SLEEP: durationMillis, 0..600000", EnvVars: scheduleEnv("milliseconds")},
			&cli.StringFlag{Name: "text", Usage: "WORD_COUNT, SHA256: the text", EnvVars: scheduleEnv("text")},
			&cli.Int64Flag{Name: "limit", Usage: "PRIME_COUNT: count primes below this, 2..50000000", EnvVars: scheduleEnv("limit")},
			&cli.Int64Flag{Name: "fail-until-attempt", Usage: "FAIL: fail while the attempt is below this, 0..1000", EnvVars: scheduleEnv("fail-until-attempt")},
			&cli.StringFlag{Name: "payload", Usage: "the whole payload as a JSON object, instead of a task flag", EnvVars: scheduleEnv("payload")},
			&cli.IntFlag{Name: "max-attempts", Usage: "attempts before each job fails (0: the coordinator's default)", EnvVars: scheduleEnv("max-attempts")},
			&cli.StringFlag{Name: "priority", Usage: "high, normal or low (default normal)", EnvVars: scheduleEnv("priority")},
			jsonFlag(),
		},
		Action: func(c *cli.Context) error {
			pos, err := args(c, "NAME", "TASK")
			if err != nil {
				return err
			}
			spec, err := scheduleFromFlags(c, pos[0], pos[1]) // usage errors before connecting
			if err != nil {
				return err
			}
			s, err := connect(c, false)
			if err != nil {
				return exitErr(err)
			}
			defer s.Close()
			spec.TaskType = resolveTaskType(c.Context, s.cl, pos[1])
			sc, err := s.cl.AddSchedule(c.Context, spec)
			if err != nil {
				return exitErr(fmt.Errorf("schedule add %s: %w", pos[0], err))
			}
			p := newPrinter(c.App.Writer, c.Bool("json"))
			if p.json {
				return p.jsonLine(sc)
			}
			_, err = fmt.Fprintf(p.w, "schedule %s added: %s, next run %s\n", sc.Name, when(sc), nextRun(p.now(), sc))
			return err
		},
	}
}

// scheduleFromFlags reads the schedule add's flags; the task type is resolved later.
func scheduleFromFlags(c *cli.Context, name, task string) (client.Schedule, error) {
	sc := client.Schedule{Name: name}
	if err := protocol.CheckScheduleName(name); err != nil {
		return sc, usageError("%v", err)
	}
	switch {
	case c.IsSet("every") && c.IsSet("cron"):
		return sc, usageError("give either --every or --cron, not both")
	case c.IsSet("every"):
		d, err := time.ParseDuration(c.String("every"))
		if err != nil {
			return sc, usageError("%s", badDuration("--every", c.String("every")))
		}
		if d < time.Duration(protocol.MinScheduleEveryMillis)*time.Millisecond || d%time.Millisecond != 0 {
			return sc, usageError("--every must be at least 1s, in whole milliseconds, got %v", d)
		}
		if d > time.Duration(protocol.MaxScheduleEveryMillis)*time.Millisecond {
			return sc, usageError("--every %v is more than %d days: a schedule's period is at most that long",
				d, protocol.MaxScheduleEveryMillis/86_400_000)
		}
		if c.IsSet("tz") {
			return sc, usageError("--tz applies to --cron only")
		}
		sc.Every = d
	case c.IsSet("cron"):
		sc.Cron, sc.TimeZone = c.String("cron"), c.String("tz")
	default:
		return sc, usageError("give --every DURATION or --cron SPEC")
	}
	cu, err := protocol.ParseCatchUp(c.String("catch-up"))
	if err != nil {
		return sc, usageError("--%v", err)
	}
	sc.CatchUp = cu
	payload, err := buildPayload(c, taskName(task))
	if err != nil {
		return sc, err
	}
	sc.Payload = payload
	// The schedule's own flags only, not submitOptions: submit's options grow with
	// submit's flags.
	sc.Options, err = attemptsAndPriority(c)
	return sc, err
}

func scheduleListCommand() *cli.Command {
	return &cli.Command{
		Name:    "ls",
		Aliases: []string{"list"},
		Usage:   "list the schedules: next run, last run and its job, last error",
		Description: `Lists every schedule by name: when it ticks, its state (active, paused, or failing when its
latest tick's submission was refused), the next run, the last run and its job, and the
error of the latest tick that failed.

Example:
   jobbus schedule ls
   jobbus schedule ls --json`,
		Flags: []cli.Flag{jsonFlag()},
		Action: inSession(nil, func(c *cli.Context, s *session, _ []string) error {
			scs, err := s.cl.Schedules(c.Context)
			if err != nil {
				return exitErr(err)
			}
			return newPrinter(c.App.Writer, c.Bool("json")).schedules(scs)
		}),
	}
}

func scheduleNameCommand(name, usage, more string, do func(*cli.Context, *client.Client, string) (protocol.Schedule, error)) *cli.Command {
	past := map[string]string{"pause": "paused", "resume": "resumed", "rm": "removed"}[name]
	return &cli.Command{
		Name:      name,
		Usage:     usage,
		ArgsUsage: "NAME",
		Description: fmt.Sprintf(`%s

Example:
   jobbus schedule %s nightly`, more, name),
		Flags: []cli.Flag{jsonFlag()},
		Action: inSession([]string{"NAME"}, func(c *cli.Context, s *session, pos []string) error {
			sc, err := do(c, s.cl, pos[0])
			if err != nil {
				return exitErr(fmt.Errorf("schedule %s %s: %w", name, pos[0], err))
			}
			p := newPrinter(c.App.Writer, c.Bool("json"))
			if p.json {
				return p.jsonLine(sc)
			}
			line := fmt.Sprintf("schedule %s %s", sc.Name, past)
			if name == "resume" {
				line += ", next run " + nextRun(p.now(), sc)
			}
			_, err = fmt.Fprintln(p.w, line)
			return err
		}),
	}
}

func scheduleTriggerCommand() *cli.Command {
	return &cli.Command{
		Name:      "trigger",
		Usage:     "run a schedule once now",
		ArgsUsage: "NAME",
		Description: `Submits the schedule's job now, paused or not, and prints its id; its ticks go on as before.

Example:
   jobbus schedule trigger nightly`,
		Flags: []cli.Flag{jsonFlag()},
		Action: inSession([]string{"NAME"}, func(c *cli.Context, s *session, pos []string) error {
			id, err := s.cl.TriggerSchedule(c.Context, pos[0])
			if err != nil {
				return exitErr(fmt.Errorf("schedule trigger %s: %w", pos[0], err))
			}
			p := newPrinter(c.App.Writer, c.Bool("json"))
			if p.json {
				return p.jsonLine(struct {
					JobID string `json:"jobId"`
				}{id})
			}
			_, err = fmt.Fprintln(p.w, id)
			return err
		}),
	}
}

// schedules writes schedules as a table, or as JSON lines.
func (p *printer) schedules(scs []protocol.Schedule) error {
	if p.json {
		for _, sc := range scs {
			if err := p.jsonLine(sc); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tWHEN\tTASK\tNEXT RUN\tLAST RUN\tLAST JOB\tLAST ERROR")
	now := p.now()
	for _, sc := range scs {
		last := "-"
		if sc.LastRunMillis > 0 {
			last = ago(now, sc.LastRunMillis)
		}
		lastErr := "-"
		if sc.LastError != "" {
			lastErr = truncate(fmt.Sprintf("%s (%s, %d in a row)", sc.LastError, ago(now, sc.LastErrorMillis), sc.Failures), 2*resultWidth)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sc.Name, scheduleState(sc), when(sc), sc.TaskType,
			nextRun(now, sc), last, orNothing(sc.LastJobID), lastErr)
	}
	return tw.Flush()
}

// scheduleState is active, paused, or failing while its latest tick failed.
func scheduleState(sc protocol.Schedule) string {
	switch {
	case sc.Paused:
		return "paused"
	case sc.Failures > 0:
		return "failing"
	}
	return "active"
}

// when says when a schedule ticks.
func when(sc protocol.Schedule) string {
	if sc.EveryMillis > 0 {
		return "every " + (time.Duration(sc.EveryMillis) * time.Millisecond).String()
	}
	tz := sc.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	return fmt.Sprintf("cron %q %s", sc.Cron, tz)
}

// nextRun says when a schedule's next tick is due.
func nextRun(now time.Time, sc protocol.Schedule) string {
	switch {
	case sc.Paused:
		return "- (paused)"
	case sc.NextTickMillis <= 0:
		return "-"
	}
	at := time.UnixMilli(sc.NextTickMillis)
	d := at.Sub(now)
	if d < 0 {
		d = 0
	}
	return at.UTC().Format("2006-01-02T15:04:05Z") + " (in " + short(d) + ")"
}

// scheduleRows are the rows jobbus status adds for a job a schedule's tick made.
func scheduleRows(j protocol.Job) [][2]string {
	if j.Schedule == "" {
		return nil
	}
	return [][2]string{{"SCHEDULE", j.Schedule}}
}
