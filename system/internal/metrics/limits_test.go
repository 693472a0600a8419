package metrics_test

import (
	"context"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// TestRateLimitMetrics: each limit's rate, tokens and throttled starts.
func TestRateLimitMetrics(t *testing.T) {
	t.Parallel()
	s := start(t)
	ctx := context.Background()
	if _, err := s.cl.SetLimit(ctx, client.ForTaskType("SHA256"), "1/h", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.cl.SetLimit(ctx, client.ForQueue("default"), "50/s", 5); err != nil {
		t.Fatal(err)
	}
	s.worker(t)
	first, err := s.cl.Submit(ctx, "SHA256", map[string]string{"text": "first"})
	if err != nil {
		t.Fatal(err)
	}
	s.wait(t, first, protocol.StateCompleted)
	held, err := s.cl.Submit(ctx, "SHA256", map[string]string{"text": "held"})
	if err != nil {
		t.Fatal(err)
	}
	m := scrape(t, s.url)
	for name, want := range map[string]float64{
		`jobbus_limit_rate_per_second{name="SHA256",scope="type"}`:   1.0 / 3600,
		`jobbus_limit_rate_per_second{name="default",scope="queue"}`: 50,
		`jobbus_limit_throttled_total{name="SHA256",scope="type"}`:   0,
	} {
		if got, ok := m[name]; !ok || got < want-1e-9 || got > want+1e-9 {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	// Its one token taken, a bucket of 1/h holds a sliver of the next.
	if got, ok := m[`jobbus_limit_tokens{name="SHA256",scope="type"}`]; !ok || got >= 0.01 {
		t.Errorf("jobbus_limit_tokens of SHA256 = %v (present %v), want its token taken", got, ok)
	}
	if _, err := s.cl.RemoveLimit(ctx, client.ForTaskType("SHA256")); err != nil {
		t.Fatal(err)
	}
	s.wait(t, held, protocol.StateCompleted)
	m = scrape(t, s.url)
	if _, ok := m[`jobbus_limit_tokens{name="SHA256",scope="type"}`]; ok {
		t.Error("a removed limit is still reported")
	}
	if got := m[`jobbus_limit_tokens{name="default",scope="queue"}`]; got < 3 || got > 5 {
		t.Errorf("the queue's bucket holds %v tokens, want 3..5 (burst 5, two starts)", got)
	}
}
