package dashboard_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestSummaryShowsRateLimits: the summary the page draws carries each rate limit and
// its state, polled with the workers.
func TestSummaryShowsRateLimits(t *testing.T) {
	t.Parallel()
	s := start(t, false, nil)
	if _, err := s.cl.SetLimit(context.Background(), client.ForTaskType("SHA256"), "100/m", 10); err != nil {
		t.Fatal(err)
	}
	var sum struct {
		Limits []protocol.LimitInfo `json:"limits"`
	}
	testkit.Eventually(t, waitFor, "the limit in the summary", func() bool {
		if code := getJSON(t, s.url+"/api/summary", &sum); code != http.StatusOK {
			t.Fatalf("GET /api/summary: %d", code)
		}
		return len(sum.Limits) == 1
	})
	if l := sum.Limits[0]; l.Scope != "type" || l.Name != "SHA256" || l.Rate != "100/m" || l.Burst != 10 || l.Tokens != 10 {
		t.Fatalf("summary's limit: %+v", l)
	}
}
