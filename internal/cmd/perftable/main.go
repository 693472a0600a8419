// Command perftable prints the performance table (docs/performance.md) from benchmark result files: every
// *.json under the directories given, in the shape both `jobbus bench --json` and the
// River and Asynq benchmarks (the peers' harness, PEERS_DIR in .ci/perf) write ({"system","settings","metrics"}).
// Runs of the same configuration become one row: the median of each figure, with its
// spread [min-max] and the number of runs, then the ratios against the peers.
//
//	go run ./internal/cmd/perftable /tmp/perf-results     (.ci/perf runs it)
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

type doc struct {
	System   string             `json:"system"`
	Settings map[string]string  `json:"settings"`
	Metrics  map[string]float64 `json:"metrics"`
}

// column is one figure of the table.
type column struct {
	title, metric, format string
}

var columns = []column{
	{"jobs/s, first submit to last completion", "e2e.jobs_per_s", "%.0f"},
	{"steady rate (from first start)", "e2e.jobs_per_s_after_first_start", "%.0f"},
	{"idle submit -> completed p50 ms", "latency.complete.p50_ms", "%.2f"},
	{"idle p99 ms", "latency.complete.p99_ms", "%.2f"},
	{"load submit -> completed p99 ms", "e2e.complete.p99_ms", "%.0f"},
	{"CPU ms/job", "e2e.cpu_ms_per_job", "%.3f"},
	{"heap allocs/job", "e2e.allocs_per_job", "%.0f"},
	{"peak RSS MiB", "e2e.peak_rss_mib", "%.0f"},
}

// row is one configuration's runs.
type row struct {
	label string
	order string // sorts the rows: the peers first, then jobbus's shapes, native before TCP, default fsync first
	runs  []doc
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: perftable DIR...")
		os.Exit(2)
	}
	rows, err := load(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "perftable:", err)
		os.Exit(1)
	}
	printTable(os.Stdout, rows)
}

func load(dirs []string) ([]*row, error) {
	var rows []*row
	byLabel := map[string]*row{}
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".json") {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			var dc doc
			if json.Unmarshal(data, &dc) != nil || dc.System == "" || dc.Metrics == nil {
				return nil // not a result file (the peers' summary.json, env files)
			}
			l := label(dc)
			r := byLabel[l]
			if r == nil {
				r = &row{label: l, order: order(dc)}
				byLabel[l] = r
				rows = append(rows, r)
			}
			r.runs = append(r.runs, dc)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(rows, func(a, b *row) int { return strings.Compare(a.order, b.order) })
	return rows, nil
}

// order is a row's sort key.
func order(d doc) string {
	s := d.Settings
	if d.System != "jobbus" {
		return "0 " + d.System + " " + s["redis_appendonly"]
	}
	sync := "0"
	if s["sync"] != "" && s["sync"] != "default" {
		sync = "1 " + s["sync"]
	}
	return fmt.Sprintf("1 %08s %s %s", s["submitters"], sync, s["transport"])
}

// label names a configuration: jobbus's from its bench settings, a peer's by its system.
func label(d doc) string {
	s := d.Settings
	if d.System != "jobbus" {
		if s["redis_appendonly"] == "yes" {
			return d.System + " (appendfsync " + s["redis_appendfsync"] + ")"
		}
		return d.System
	}
	l := fmt.Sprintf("jobbus %s (%s submitters, %s x %s slots)", s["transport"], s["submitters"], s["workers"], s["worker_capacity"])
	if s["sync"] != "" && s["sync"] != "default" {
		l += ", --sync " + s["sync"]
	}
	return l
}

// stats are the median, minimum and maximum of a figure over a row's runs.
func stats(r *row, metric string) (med, lo, hi float64, n int) {
	var v []float64
	for _, d := range r.runs {
		if x, ok := d.Metrics[metric]; ok {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return 0, 0, 0, 0
	}
	slices.Sort(v)
	med = v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return med, v[0], v[len(v)-1], len(v)
}

func printTable(w io.Writer, rows []*row) {
	fmt.Fprint(w, "| | runs |")
	for _, c := range columns {
		fmt.Fprintf(w, " %s |", c.title)
	}
	fmt.Fprint(w, "\n|---|---|")
	for range columns {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %d |", r.label, len(r.runs))
		for _, c := range columns {
			med, lo, hi, n := stats(r, c.metric)
			if n == 0 {
				fmt.Fprint(w, " - |")
				continue
			}
			f := c.format
			fmt.Fprintf(w, " "+f+" ["+f+"-"+f+"] |", med, lo, hi)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	printRatios(w, rows)
}

// printRatios prints the ratios the performance page quotes, from the medians: TCP to
// native, --sync always to default, and jobbus to Asynq's steady rate.
func printRatios(w io.Writer, rows []*row) {
	find := func(pred func(string) bool) *row {
		for _, r := range rows {
			if pred(r.label) {
				return r
			}
		}
		return nil
	}
	rate := func(r *row, m string) float64 { med, _, _, _ := stats(r, m); return med }
	ratio := func(name string, a, b *row, ma, mb string) {
		if a == nil || b == nil || rate(b, mb) == 0 {
			return
		}
		fmt.Fprintf(w, "- %s: %.2f (%s / %s)\n", name, rate(a, ma)/rate(b, mb), a.label, b.label)
	}
	const e2e, steady, cpu = "e2e.jobs_per_s", "e2e.jobs_per_s_after_first_start", "e2e.cpu_ms_per_job"
	for _, r := range rows {
		if !strings.HasPrefix(r.label, "jobbus native") {
			continue
		}
		tcp := find(func(l string) bool { return l == strings.Replace(r.label, "jobbus native", "jobbus tcp", 1) })
		ratio("TCP / native, jobs/s", tcp, r, e2e, e2e)
		// On a machine shared with other work the rates mostly measure the others; CPU
		// time per job does not, and its inverse is the rate a saturated machine reaches.
		ratio("TCP / native, by CPU per job (native's / TCP's)", r, tcp, cpu, cpu)
		if !strings.Contains(r.label, "--sync") {
			always := find(func(l string) bool { return l == r.label+", --sync always" })
			ratio("--sync always / default, jobs/s", always, r, e2e, e2e)
		}
		asynq := find(func(l string) bool { return l == "asynq" })
		ratio("jobbus steady / Asynq steady", r, asynq, steady, steady)
		asynqFsync := find(func(l string) bool { return strings.HasPrefix(l, "asynq (") })
		ratio("jobbus steady / Asynq (fsync) steady", r, asynqFsync, steady, steady)
	}
}
