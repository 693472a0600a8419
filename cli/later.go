package cli

import (
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// Delayed jobs on the command line: submit --in and --at, and how status and jobs show
// a job's due time.

func laterFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "in", Usage: "run the job after this long (10m, 1h30m): it waits SCHEDULED until then", EnvVars: submitEnv("in")},
		&cli.StringFlag{Name: "at", Usage: "run the job at this RFC 3339 time (2026-12-24T09:00:00Z): it waits SCHEDULED until then", EnvVars: submitEnv("at")},
	}
}

// laterOptions is --in or --at as a submit option, if either is given.
func laterOptions(c *cli.Context) ([]client.SubmitOption, error) {
	switch {
	case c.IsSet("in") && c.IsSet("at"):
		return nil, usageError("--in and --at cannot be combined: give the delay or the time")
	case c.IsSet("in"):
		d := c.Duration("in")
		if d < 0 {
			return nil, usageError("--in must not be negative, got %v", d)
		}
		if d > protocol.MaxRunAhead {
			return nil, usageError("--in %v is more than %d days: a job is scheduled at most 10 years ahead",
				d, protocol.MaxRunAhead/(24*time.Hour))
		}
		return []client.SubmitOption{client.RunIn(d)}, nil
	case c.IsSet("at"):
		t, err := time.Parse(time.RFC3339, c.String("at"))
		if err != nil {
			return nil, usageError("--at must be an RFC 3339 time such as 2026-12-24T09:00:00Z (or with an offset, +01:00), got %q", c.String("at"))
		}
		// The coordinator refuses it too, but its hint is for a number on the wire
		// (microseconds given for milliseconds), not for a date typed as a date.
		if time.Until(t) > protocol.MaxRunAhead {
			return nil, usageError("--at %s is more than %d days ahead: a job is scheduled at most 10 years ahead",
				c.String("at"), protocol.MaxRunAhead/(24*time.Hour))
		}
		return []client.SubmitOption{client.RunAt(t)}, nil
	}
	return nil, nil
}

// due is how a table shows a SCHEDULED job's due time: "due in 5m".
func due(now time.Time, j protocol.Job) string {
	if j.State != protocol.StateScheduled || j.RunAtMillis == 0 {
		return ""
	}
	d := time.UnixMilli(j.RunAtMillis).Sub(now)
	if d <= 0 {
		return "due now"
	}
	return "due in " + short(d)
}

// dueRow is the detail view's row of a delayed job's due time: DUE while the job waits
// SCHEDULED; once it does not (it came due, or was cancelled first), WAS DUE, as the
// dashboard says, kept as information: a time it never reached is "not reached", never
// "in 59m", which would read as still pending.
func dueRow(now time.Time, j protocol.Job) [2]string {
	if j.RunAtMillis <= 0 {
		return [2]string{"DUE", "-"}
	}
	at := time.UnixMilli(j.RunAtMillis)
	rel := ago(now, j.RunAtMillis)
	if d := at.Sub(now); d > 0 {
		rel = "in " + short(d)
	}
	label := "DUE"
	if j.State != protocol.StateScheduled {
		label = "WAS DUE"
		if at.After(now) {
			rel = "not reached"
		}
	}
	return [2]string{label, at.UTC().Format("2006-01-02T15:04:05.000Z") + " (" + rel + ")"}
}
