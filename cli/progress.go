package cli

import (
	"fmt"
	"io"
	"math"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
)

// A job's progress while a command waits for it (submit --wait, wait, status
// --follow): on a terminal, the spinner's line gains a bar; otherwise each change of
// state or progress is one line on stderr, so a log or CI shows how the job went.

// progressBar draws fraction as a bar of width cells.
func progressBar(fraction float64, width int) string {
	full := int(math.Round(protocol.ClampProgress(fraction) * float64(width)))
	return "[" + strings.Repeat("█", full) + strings.Repeat("░", width-full) + "]"
}

// progressText is the job's progress as "52% message", or "" without one.
func progressText(j protocol.Job) string {
	f, msg, ok := jobProgress(j)
	if !ok {
		return ""
	}
	s := fmt.Sprintf("%3.0f%%", 100*protocol.ClampProgress(f))
	if msg != "" {
		s += " " + msg
	}
	return s
}

// progressLines writes a line each time the job's progress (or, once it reported
// some, its state or attempt) changes: the wait's view when not on a terminal. A job
// that reports no progress prints nothing, as before.
type progressLines struct {
	w      io.Writer
	always bool // a line per change even without progress (status --follow)
	last   string
}

func (p *progressLines) show(j protocol.Job) {
	t := progressText(j)
	if t == "" && p.last == "" && !p.always {
		return
	}
	line := fmt.Sprintf("job %s %s, attempt %d/%d", j.JobID, j.State, j.Attempts, j.MaxAttempts)
	if t != "" {
		line += ": " + t
	}
	if line == p.last {
		return
	}
	p.last = line
	fmt.Fprintln(p.w, line)
}

// followJob is status --follow: the job live until it ends, then its snapshot.
func followJob(c *cli.Context, s *session, id string) error {
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	p := newPrinter(c.App.Writer, c.Bool("json"))
	var show func(protocol.Job)
	var sp *spinner
	switch {
	case p.json: // a snapshot per change
		var last string
		show = func(j protocol.Job) {
			key := fmt.Sprintf("%s %d %s", j.State, j.Attempts, progressText(j))
			if key != last {
				last = key
				_ = p.jsonLine(j)
			}
		}
	case isTerminal(c.App.ErrWriter):
		sp = &spinner{w: c.App.ErrWriter, start: time.Now()}
		show = sp.show
	default:
		show = (&progressLines{w: c.App.ErrWriter, always: true}).show
	}
	job, err := waitJob(ctx, s.cl, id, show)
	sp.clear()
	switch {
	case err != nil && ctx.Err() != nil:
		return cli.Exit(fmt.Sprintf("stopped following job %s (still %s)", id, orUnknown(job.State)), ExitError)
	case err != nil:
		return exitErr(err)
	case p.json:
		return nil // its last snapshot is out
	}
	return p.job(job)
}
