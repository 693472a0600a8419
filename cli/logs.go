package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/client"
)

func logsCommand() *cli.Command {
	return &cli.Command{
		Name:      "logs",
		Usage:     "print a job's log",
		ArgsUsage: "ID",
		Description: `Prints what the job's handlers wrote with worker.Logger(ctx): one line per record, oldest
first (a job keeps its last 64 chunks, a chunk being what its worker shipped at once,
at most every 200 ms: at most 1 MiB; a marker says where older records were dropped).
With --follow it goes on printing while the job runs and returns once it has ended (a
job cancelled, or past its deadline, ends before its handler returns: --follow waits at
most 2 s more for what the handler logs as it stops).
With --json it prints each record as the worker wrote it (slog's JSON).
Logs are read from JetStream over NATS (stream JOBBUS_LOGS, subject jobbus.logs.ID).

Examples:
   jobbus logs 0b7c2f0e-8a41-4d7e-9b43-3f6a1c2d9e10
   jobbus logs 0b7c2f0e-8a41-4d7e-9b43-3f6a1c2d9e10 --follow`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing until the job ends", EnvVars: env("follow")},
			jsonFlag(),
		},
		Action: onJob(func(c *cli.Context, s *session, id string) error {
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			asJSON := c.Bool("json")
			err := s.cl.Logs(ctx, id, c.Bool("follow"), func(r client.LogRecord) error {
				if asJSON {
					_, err := fmt.Fprintf(c.App.Writer, "%s\n", r.JSON)
					return err
				}
				return printLogRecord(c.App.Writer, r)
			})
			switch {
			case err != nil && ctx.Err() != nil && c.Context.Err() == nil:
				return nil // Ctrl-C ends a follow
			case errors.Is(err, context.Canceled):
				return nil
			case err != nil:
				return exitErr(err)
			}
			return nil
		}),
	}
}

// printLogRecord writes a record as one line: time, level, attempt, message, and its
// other attributes as key=value.
func printLogRecord(w io.Writer, r client.LogRecord) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(r.JSON, &fields); err != nil {
		_, err := fmt.Fprintf(w, "%s\n", r.JSON)
		return err
	}
	at, level, msg := r.Fields()
	var b strings.Builder
	if !at.IsZero() {
		b.WriteString(at.Local().Format("15:04:05.000 "))
	} else {
		b.WriteString(strings.Repeat(" ", 13))
	}
	fmt.Fprintf(&b, "%-5s #%d %s", level, r.Attempt, msg)
	keys := make([]string, 0, len(fields))
	for k := range fields {
		switch k {
		case "time", "level", "msg", "attempt":
		default:
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := string(fields[k])
		var s string
		if json.Unmarshal(fields[k], &s) == nil && !strings.ContainsAny(s, " \t\"=") {
			v = s
		}
		fmt.Fprintf(&b, " %s=%s", k, v)
	}
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}
