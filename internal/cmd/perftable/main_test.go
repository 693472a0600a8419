package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTable: runs of one configuration become one row of medians with their spread,
// jobbus's rows are named by their bench settings and a peer's by its system, and the
// ratios of the targets come from the medians.
func TestTable(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, d doc) {
		t.Helper()
		data, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	jobbus := func(transport string, rate float64) doc {
		return doc{System: "jobbus",
			Settings: map[string]string{"transport": transport, "sync": "default", "submitters": "16", "workers": "1", "worker_capacity": "64"},
			Metrics:  map[string]float64{"e2e.jobs_per_s": rate, "e2e.jobs_per_s_after_first_start": rate}}
	}
	for i, rate := range []float64{10000, 12000, 11000} {
		write("native-"+string(rune('a'+i))+".json", jobbus("native", rate))
		write("tcp-"+string(rune('a'+i))+".json", jobbus("tcp", rate*0.9))
	}
	write("asynq-1.json", doc{System: "asynq", Settings: map[string]string{"redis_appendonly": "no"},
		Metrics: map[string]float64{"e2e.jobs_per_s_after_first_start": 5500}})
	write("summary.json", doc{}) // not a result file: skipped
	rows, err := load([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printTable(&out, rows)
	got := out.String()
	for _, want := range []string{
		"| jobbus native (16 submitters, 1 x 64 slots) | 3 | 11000 [10000-12000] |",
		"| jobbus tcp (16 submitters, 1 x 64 slots) | 3 | 9900 [9000-10800] |",
		"| asynq | 1 | - | 5500 [5500-5500] |",
		"- TCP / native, jobs/s: 0.90 (",
		"- jobbus steady / Asynq steady: 2.00 (",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}
