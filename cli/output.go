package cli

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jobbus/jobbus/bus/protocol"
)

// printer writes what the client commands show: aligned tables for people, one JSON
// object per line for scripts (--json). Colour marks states only on a terminal, and
// never with NO_COLOR set.
type printer struct {
	w     io.Writer
	json  bool
	color bool
	now   func() time.Time
	loc   *time.Location // of watch's clock; nil means local time
}

func newPrinter(w io.Writer, asJSON bool) *printer {
	return &printer{w: w, json: asJSON, color: !asJSON && colorAllowed(w), now: time.Now}
}

// isTerminal reports whether w is a character device (a terminal, not a file or pipe).
func isTerminal(w io.Writer) bool {
	if t, ok := w.(interface{ IsTerminal() bool }); ok {
		return t.IsTerminal() // a writer that knows, as a test's stand-in for a terminal
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func colorAllowed(w io.Writer) bool {
	return os.Getenv("NO_COLOR") == "" && isTerminal(w)
}

// jsonLine writes v as one line of JSON.
func (p *printer) jsonLine(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = p.w.Write(append(b, '\n'))
	return err
}

// Every state's colour code is 5 bytes and the reset 4, so a coloured column stays
// aligned under text/tabwriter, which counts the escape bytes as width.
const colorReset = "\x1b[0m"

var stateColors = map[protocol.State]string{
	protocol.StateQueued:    "\x1b[39m", // default foreground
	protocol.StateRunning:   "\x1b[36m", // cyan
	protocol.StateRetryWait: "\x1b[33m", // yellow
	protocol.StateCompleted: "\x1b[32m", // green
	protocol.StateFailed:    "\x1b[31m", // red
	protocol.StateCancelled: "\x1b[35m", // magenta
}

func (p *printer) state(s protocol.State) string { return p.paddedState(s, 0) }

// paddedState pads s to width before colouring it, so the padding stays uncoloured-width.
func (p *printer) paddedState(s protocol.State, width int) string {
	text := fmt.Sprintf("%-*s", width, s)
	if !p.color {
		return text
	}
	code, ok := stateColors[s]
	if !ok {
		code = "\x1b[39m"
	}
	return code + text + colorReset
}

// header pads a header over a coloured column the same way its cells are.
func (p *printer) header(h string) string {
	if !p.color {
		return h
	}
	return "\x1b[39m" + h + colorReset
}

// resultWidth bounds the RESULT/ERROR column of tables.
const resultWidth = 40

// jobs writes jobs as a table, or as JSON lines.
func (p *printer) jobs(jobs []protocol.Job) error {
	if p.json {
		for _, j := range jobs {
			if err := p.jsonLine(j); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ID\t%s\tTASK\tATTEMPTS\tPRIORITY\tWORKER\tAGE\tRESULT/ERROR\n", p.header("STATE"))
	now := p.now()
	for _, j := range jobs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\n",
			j.JobID, p.state(j.State), j.TaskType, j.Attempts, j.MaxAttempts, j.Priority,
			orNothing(j.RanBy()), ago(now, j.CreatedAtMillis), truncate(cmp.Or(due(now, j), outcome(j)), resultWidth))
	}
	return tw.Flush()
}

// job writes one job in full, one field a line, or as a JSON line.
func (p *printer) job(j protocol.Job) error {
	if p.json {
		return p.jsonLine(j)
	}
	now := p.now()
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	rows := [][2]string{
		{"ID", j.JobID},
		{"STATE", p.state(j.State)},
		{"TASK", j.TaskType},
		{"ATTEMPTS", fmt.Sprintf("%d/%d", j.Attempts, j.MaxAttempts)},
		{"PRIORITY", string(j.Priority)},
		{"WORKER", orNothing(j.RanBy())},
		{"CREATED", stamp(now, j.CreatedAtMillis)},
		{"UPDATED", stamp(now, j.UpdatedAtMillis)},
		dueRow(now, j), // later.go
		{"RESULT", oneLine(orDash(j.Result))},
		{"ERROR", oneLine(orDash(j.Error))},
	}
	if j.Snoozes > 0 {
		rows = append(rows, [2]string{"SNOOZES", strconv.Itoa(j.Snoozes)})
	}
	if t := progressText(j); t != "" { // only for a job whose handler reported some
		rows = slices.Insert(rows, 8, [2]string{"PROGRESS", oneLine(strings.TrimSpace(t))})
	}
	rows = append(rows, workflowRows(j)...) // workflow.go
	rows = append(rows, scheduleRows(j)...) // schedules.go
	for _, r := range rows {
		if r[0] == "DUE" && r[1] == "-" {
			continue // a job that never waited for a time
		}
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

// workers writes workers as a table, or as JSON lines.
func (p *printer) workers(ws []protocol.Worker) error { return p.workersServing(ws, nil) }

// builtinTypes are the five built-ins, as a worker serving them all lists them.
var builtinTypes = strings.Join(taskNames(), ",")

// workersServing prints the workers; with serving (each worker's task types, from the
// catalogue), the table has a TYPES column. --json keeps the spec's snapshot fields:
// `jobbus types --json` lists each type's workers.
func (p *printer) workersServing(ws []protocol.Worker, serving map[string][]string) error {
	types := func(id string) string {
		t := strings.Join(serving[id], ",")
		if t == builtinTypes {
			return "built-ins"
		}
		return strings.Replace(t, builtinTypes, "built-ins", 1)
	}
	if serving != nil && !p.json {
		tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKER	ACTIVE	CAPACITY	LAST HEARTBEAT	TYPES")
		now := p.now()
		for _, w := range ws {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", w.WorkerID, w.ActiveTasks, w.Capacity, ago(now, w.LastHeartbeatMillis), orNone(types(w.WorkerID)))
		}
		return tw.Flush()
	}
	if p.json {
		for _, w := range ws {
			if err := p.jsonLine(w); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tACTIVE\tCAPACITY\tLAST HEARTBEAT")
	now := p.now()
	for _, w := range ws {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", w.WorkerID, w.ActiveTasks, w.Capacity, ago(now, w.LastHeartbeatMillis))
	}
	return tw.Flush()
}

// outcome is what a table shows of a job's end: its result once completed, otherwise
// the last error (kept even after a later success), otherwise any result.
func outcome(j protocol.Job) string {
	switch {
	case j.State == protocol.StateCompleted && j.Result != nil:
		return *j.Result
	case j.Error != nil:
		return *j.Error
	case j.Result != nil:
		return *j.Result
	}
	return "-"
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orDash(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

// oneLine keeps a value on its table row.
func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ", "\t", " ").Replace(s)
}

// truncate cuts s to n runes, marking the cut with an ellipsis.
func truncate(s string, n int) string {
	s = oneLine(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// ago renders how long before now a millisecond timestamp was: "3s ago", "5m ago".
func ago(now time.Time, millis int64) string {
	if millis <= 0 {
		return "-"
	}
	d := now.Sub(time.UnixMilli(millis))
	if d < 0 {
		d = 0
	}
	return short(d) + " ago"
}

func short(d time.Duration) string {
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d"
}

// stamp renders a timestamp for the detail view: RFC 3339 in UTC and its age.
func stamp(now time.Time, millis int64) string {
	if millis <= 0 {
		return "-"
	}
	return time.UnixMilli(millis).UTC().Format("2006-01-02T15:04:05.000Z") + " (" + ago(now, millis) + ")"
}

// watchEvent writes one line of watch.
func (p *printer) watchEvent(ev watchEvent) error {
	if p.json {
		return p.jsonLine(ev)
	}
	clock := time.UnixMilli(ev.AtMillis).In(p.zone()).Format("15:04:05")
	var line string
	switch ev.Event {
	case "job":
		j := ev.Job
		line = fmt.Sprintf("job %s  %s  %-11s  %d/%d  %-6s", j.JobID, p.paddedState(j.State, 10), j.TaskType, j.Attempts, j.MaxAttempts, j.Priority)
		switch {
		case j.WorkerID != nil:
			line += "  on " + *j.WorkerID
		case j.State == protocol.StateScheduled:
			line += "  " + due(time.UnixMilli(ev.AtMillis), *j)
		case j.State.Terminal() || j.State == protocol.StateRetryWait:
			if o := outcome(*j); o != "-" {
				line += "  " + truncate(o, 2*resultWidth)
			}
		}
	case "job_removed":
		line = "job " + ev.JobID + "  removed"
	case "worker_joined":
		line = fmt.Sprintf("worker %s joined (capacity %d)", ev.Worker.WorkerID, ev.Worker.Capacity)
	case "worker_left":
		line = fmt.Sprintf("worker %s left", ev.Worker.WorkerID)
	}
	_, err := fmt.Fprintln(p.w, strings.TrimRight(clock+"  "+line, " "))
	return err
}

func (p *printer) zone() *time.Location {
	if p.loc != nil {
		return p.loc
	}
	return time.Local
}

// orNothing is s, or "-" when it is empty.
func orNothing(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
