package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// limitCommand is `jobbus limit set|ls|rm`: the rate limits of task types and queues.
func limitCommand() *cli.Command {
	target := func() []cli.Flag {
		return []cli.Flag{
			&cli.StringFlag{Name: "type", Usage: "limit the jobs of this task type", EnvVars: env("limit-type")},
			&cli.StringFlag{Name: "queue", Usage: "limit the jobs of this queue", EnvVars: env("limit-queue")},
		}
	}
	return &cli.Command{
		Name:  "limit",
		Usage: "set, list and remove rate limits of task types and queues",
		Description: `A rate limit bounds how many jobs of a task type, or of a queue, start per period: a
token bucket that holds at most --burst tokens and gains the rate's count per period, kept
by the leading coordinator. Jobs over the limit wait QUEUED (they never fail for it) and
start as tokens come. The setting is durable; a coordinator that takes the lead starts the
bucket empty, so a failover never lets more than rate + burst start in any period.

Examples:
   jobbus limit set --type SEND_EMAIL --rate 100/m --burst 10
   jobbus limit set --queue low --rate 5/s
   jobbus limit ls
   jobbus limit rm --type SEND_EMAIL`,
		Action: unknownSubcommand, // usage.go
		Subcommands: subcommandsWithGlobals("limit", []*cli.Command{
			{
				Name:  "set",
				Usage: "create or change a rate limit",
				Description: `Sets the limit of one task type (--type) or one queue (--queue). --rate is COUNT/PERIOD:
100/s, 100/m, 5/h, 1000/d, or a duration as the period (10/30s). --burst is how many jobs
may start at once after a quiet spell: when not given, a limit keeps the burst it has
(a new one gets 1). Changing a limit keeps the tokens its bucket holds (at most the new
burst).

Examples:
   jobbus limit set --type SEND_EMAIL --rate 100/m --burst 10
   jobbus limit set --queue default --rate 50/s`,
				Flags: append(target(),
					&cli.StringFlag{Name: "rate", Usage: "starts per period: COUNT/PERIOD, as 100/s, 100/m, 10/30s", EnvVars: env("limit-rate")},
					&cli.Int64Flag{Name: "burst", Value: 1, DefaultText: "the limit's current burst, 1 for a new one", Usage: "tokens the bucket holds at most: starts that may follow one another at once", EnvVars: env("limit-burst")},
					jsonFlag()),
				Action: inSession(nil, func(c *cli.Context, s *session, _ []string) error {
					t, err := limitTarget(c, s)
					if err != nil {
						return err
					}
					if !c.IsSet("rate") {
						return usageError("limit set needs --rate COUNT/PERIOD, as 100/m")
					}
					if b := c.Int64("burst"); b < 1 || b > protocol.MaxLimitBurst {
						return usageError("limit set: --burst must be 1 to %d, got %d", protocol.MaxLimitBurst, b)
					}
					info, err := setLimit(c, s.cl, t)
					if errors.Is(err, protocol.ErrBadLimit) {
						return usageError("limit set: %v", err)
					}
					if err != nil {
						return exitErr(fmt.Errorf("limit set %s: %w", t, err))
					}
					return newPrinter(c.App.Writer, c.Bool("json")).limits([]protocol.LimitInfo{info})
				}),
			},
			{
				Name:  "ls",
				Usage: "list the rate limits and their state",
				Description: `Lists every limit with its state on the leading coordinator: the rate, the burst, the
tokens its bucket holds now, and how many starts had to wait for a token since that
coordinator took the lead (THROTTLED).

Example:
   jobbus limit ls --json`,
				Flags: []cli.Flag{jsonFlag()},
				Action: inSession(nil, func(c *cli.Context, s *session, _ []string) error {
					infos, err := s.cl.Limits(c.Context)
					if err != nil {
						return exitErr(fmt.Errorf("limit ls: %w", err))
					}
					return newPrinter(c.App.Writer, c.Bool("json")).limits(infos)
				}),
			},
			{
				Name:  "rm",
				Usage: "remove a rate limit",
				Description: `Removes the limit of one task type (--type) or one queue (--queue): its jobs start as
fast as workers take them.

Example:
   jobbus limit rm --type SEND_EMAIL`,
				Flags: append(target(), jsonFlag()),
				Action: inSession(nil, func(c *cli.Context, s *session, _ []string) error {
					t, err := limitTarget(c, s)
					if err != nil {
						return err
					}
					info, err := s.cl.RemoveLimit(c.Context, t)
					if err != nil {
						return exitErr(fmt.Errorf("limit rm %s: %w", t, err))
					}
					p := newPrinter(c.App.Writer, c.Bool("json"))
					if p.json {
						return p.jsonLine(info)
					}
					_, err = fmt.Fprintf(p.w, "removed the limit of %s (%s, burst %d)\n", t, info.Rate, info.Burst)
					return err
				}),
			},
		}),
	}
}

// setLimit sets the limit on t with --burst if given, else with the burst the limit
// has (1 for a new limit), so that changing only the rate keeps it (as queue set keeps
// a limit not given). The coordinator reads that burst as it writes: one another
// operator sets meanwhile is kept, where a burst read here first would overwrite it.
func setLimit(c *cli.Context, cl *client.Client, t client.LimitTarget) (protocol.LimitInfo, error) {
	if c.IsSet("burst") {
		return cl.SetLimit(c.Context, t, c.String("rate"), c.Int64("burst"))
	}
	return cl.SetLimitRate(c.Context, t, c.String("rate"))
}

// limitTarget is the --type or --queue given, exactly one of them. A task type is
// named as submit names it (sleep is SLEEP, text-reverse a declared TEXT_REVERSE); one
// nobody declared yet is taken as typed.
func limitTarget(c *cli.Context, s *session) (client.LimitTarget, error) {
	ty, q := c.String("type"), c.String("queue")
	var t client.LimitTarget
	switch {
	case ty != "" && q != "":
		return t, usageError("%s takes --type or --queue, not both", cmdName(c))
	case ty != "":
		t = client.ForTaskType(ty)
	case q != "":
		t = client.ForQueue(q)
	default:
		return t, usageError("%s needs --type TASK_TYPE or --queue NAME", cmdName(c))
	}
	if t.Scope == protocol.LimitTaskType {
		t.Name = limitTaskType(c.Context, s.cl, ty)
	}
	if err := protocol.CheckLimitTarget(t.Scope, t.Name); err != nil {
		return t, usageError("%s: %v", cmdName(c), err)
	}
	return t, nil
}

func (p *printer) limits(infos []protocol.LimitInfo) error {
	if p.json {
		for _, in := range infos {
			if err := p.jsonLine(in); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LIMIT\tRATE\tBURST\tTOKENS\tTHROTTLED\tNEXT TOKEN")
	now := p.now()
	for _, in := range infos {
		next := "-"
		if in.NextTokenMillis > 0 {
			next = "in " + time.UnixMilli(in.NextTokenMillis).Sub(now).Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s %s\t%s\t%d\t%s\t%d\t%s\n", in.Scope, in.Name, in.Rate, in.Burst,
			strconv.FormatFloat(in.Tokens, 'f', 2, 64), in.Throttled, next)
	}
	return tw.Flush()
}

// limitTaskType is the task type typed names: a built-in in any case, a declared type
// by its name or as submit finds it, else the name as typed.
func limitTaskType(ctx context.Context, cl *client.Client, typed string) string {
	return findTaskType(ctx, cl, typed, typed) // types.go
}

// uniqueOption is submit's --unique-for or --unique-while, as a submit option.
func uniqueOption(c *cli.Context) ([]client.SubmitOption, error) {
	forSet, whileSet := c.IsSet("unique-for"), c.IsSet("unique-while")
	switch {
	case forSet && whileSet:
		return nil, usageError("--unique-for and --unique-while cannot be combined: a job is unique for a window or while active")
	case forSet:
		d := c.Duration("unique-for")
		if d < time.Millisecond {
			return nil, usageError("--unique-for must be positive (1ms or more), got %v", d)
		}
		if d > protocol.MaxUniqueFor {
			// The coordinator refuses it too, but names the wire's field in milliseconds.
			return nil, usageError("--unique-for %v is more than %d days: a job is unique for at most that long",
				d, protocol.MaxUniqueFor/(24*time.Hour))
		}
		return []client.SubmitOption{client.UniqueFor(d)}, nil
	case whileSet:
		if w := c.String("unique-while"); w != protocol.UniqueWhileActive {
			return nil, usageError("--unique-while must be %q, got %q", protocol.UniqueWhileActive, w)
		}
		return []client.SubmitOption{client.UniqueWhileActive()}, nil
	}
	return nil, nil
}
