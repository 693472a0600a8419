package tasks_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"

	"github.com/jobbus/jobbus/internal/jobctx"
	"github.com/jobbus/jobbus/worker/tasks"
)

// reports is a jobctx.Scope that keeps what it was told.
type reports struct {
	mu        sync.Mutex
	fractions []float64
	last      string
}

func (r *reports) Progress(f float64, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fractions = append(r.fractions, f)
	r.last = msg
}

func (r *reports) Logger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestSleepReportsProgress: on a native worker (a Scope in its context) a SLEEP of at
// least half a second reports rising progress up to 1; a shorter one reports nothing,
// so that it costs its job no record write.
func TestSleepReportsProgress(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		millis int
		report bool
	}{{"Long", 600, true}, {"Short", 50, false}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &reports{}
			payload, _ := json.Marshal(map[string]int{"durationMillis": tt.millis})
			out, err := tasks.Builtins().Run(jobctx.With(context.Background(), r), tasks.TypeSleep, 1, payload)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.report {
				if len(r.fractions) != 0 {
					t.Fatalf("%s: a short sleep reported %v", out, r.fractions)
				}
				return
			}
			n := len(r.fractions)
			if n < 3 || r.fractions[0] != 0 || r.fractions[n-1] != 1 || r.last != "slept 600 of 600 ms" {
				t.Fatalf("reports %v, last %q", r.fractions, r.last)
			}
			for i := 1; i < n; i++ {
				if r.fractions[i] < r.fractions[i-1] {
					t.Fatalf("progress went back: %v", r.fractions)
				}
			}
		})
	}
}
