package workercfg_test

import (
	"context"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/worker/internal/workercfg"
	"github.com/jobbus/jobbus/worker/tasks"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		capacity  int
		heartbeat time.Duration
		want      []string // a fragment of each problem, in order
	}{
		{name: "Valid", capacity: 4, heartbeat: time.Second},
		{name: "Bounds", capacity: 1, heartbeat: time.Millisecond},
		{name: "MaxCapacity", capacity: 1024, heartbeat: time.Second},
		{name: "ZeroCapacity", capacity: 0, heartbeat: time.Second, want: []string{"capacity must be in 1..1024, got 0"}},
		{name: "CapacityTooLarge", capacity: 1025, heartbeat: time.Second, want: []string{"got 1025"}},
		{name: "ZeroHeartbeat", capacity: 4, want: []string{"heartbeat interval must be positive, got 0s"}},
		{name: "Both", capacity: -1, heartbeat: -time.Second, want: []string{"capacity", "heartbeat"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := workercfg.New(tc.capacity, tc.heartbeat)
			errs := c.Validate()
			if len(errs) != len(tc.want) {
				t.Fatalf("Validate = %v, want %d problems", errs, len(tc.want))
			}
			for i, err := range errs {
				if !strings.Contains(err.Error(), tc.want[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, err, tc.want[i])
				}
			}
		})
	}
}

func TestComplete(t *testing.T) {
	t.Parallel()
	c := workercfg.New(4, time.Second)
	if c.Logger != slog.Default() {
		t.Error("default logger is not slog.Default()")
	}
	c.Complete()
	if !regexp.MustCompile(`^worker-[0-9a-f]{8}$`).MatchString(c.ID) {
		t.Errorf("default id = %q", c.ID)
	}
	if c.Registry == nil || !slices.Contains(c.Registry.Names(), tasks.TypeSleep) {
		t.Errorf("default registry = %v, want the built-ins", c.Registry)
	}

	r := tasks.NewRegistry()
	set := workercfg.Common{ID: "w-1", Registry: r}
	set.Complete()
	if set.ID != "w-1" || set.Registry != r {
		t.Errorf("Complete replaced settings given: %+v", set)
	}
	if a, b := workercfg.RandomID(), workercfg.RandomID(); a == b {
		t.Errorf("two random ids are both %q", a)
	}
}

func TestLoggerNilDiscards(t *testing.T) {
	t.Parallel()
	l := workercfg.Logger(nil)
	if l == nil || l.Enabled(context.Background(), slog.LevelError) {
		t.Errorf("Logger(nil) = %v, want one that discards", l)
	}
	given := slog.New(slog.DiscardHandler)
	if workercfg.Logger(given) != given {
		t.Error("Logger replaced a logger given")
	}
}
