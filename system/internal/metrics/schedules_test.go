package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestScheduleMetrics: each tick's outcome is counted by schedule, and the leading
// coordinator's schedules report how many ticks in a row failed.
func TestScheduleMetrics(t *testing.T) {
	t.Parallel()
	s := start(t)
	if _, err := s.cl.AddSchedule(context.Background(), client.Schedule{Name: "m", Every: time.Second, TaskType: "SHA256", Payload: map[string]string{"text": "x"}}); err != nil {
		t.Fatal(err)
	}
	var got map[string]float64
	testkit.Eventually(t, waitFor, "a submitted tick counted", func() bool {
		got = scrape(t, s.url)
		return got[`jobbus_schedule_ticks_total{outcome="submitted",schedule="m"}`] >= 1
	})
	if v, ok := got[`jobbus_schedule_consecutive_failures{schedule="m"}`]; !ok || v != 0 {
		t.Errorf("consecutive failures of m: %v (listed %v), want 0", v, ok)
	}
}
