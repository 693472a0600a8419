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

// dueStamp renders a due time for the detail view: RFC 3339 in UTC and how far off.
func dueStamp(now time.Time, millis int64) string {
	if millis <= 0 {
		return "-"
	}
	at := time.UnixMilli(millis)
	rel := ago(now, millis)
	if d := at.Sub(now); d > 0 {
		rel = "in " + short(d)
	}
	return at.UTC().Format("2006-01-02T15:04:05.000Z") + " (" + rel + ")"
}
