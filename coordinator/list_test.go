package coordinator_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// TestSubmissionBounds: what would not fit in a job record is refused up front, and so
// is an empty idempotency key, which cannot tell submissions apart.
func TestSubmissionBounds(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	big := `{"text":"x","pad":"` + strings.Repeat("p", protocol.MaxPayloadBytes) + `"}`
	if _, err := s.Client.Submit(ctx, "SHA256", rawJSON(big)); err == nil || !strings.Contains(err.Error(), "Payload exceeds") {
		t.Fatalf("oversized payload: %v", err)
	}
	for _, key := range []string{"", strings.Repeat("k", protocol.MaxKeyBytes+1)} {
		_, err := s.Client.Submit(ctx, "SHA256", text("x"), client.IdempotencyKey(key))
		if !errors.Is(err, client.ErrServer) || !strings.Contains(err.Error(), "Idempotency key must be 1 to 1024 bytes") {
			t.Fatalf("key of %d bytes: %v", len(key), err)
		}
	}
	a, err := s.Client.Submit(ctx, "SHA256", text("x"), client.IdempotencyKey(strings.Repeat("k", protocol.MaxKeyBytes)))
	must(t, err)
	// A worker's huge result is cut to fit.
	m := s.ManualWorker("w", 1)
	asg := s.NextAssign(m)
	s.Accept(m, asg, true, strings.Repeat("r", 2*protocol.MaxTextBytes))
	j := s.Status(a)
	if j.State != protocol.StateCompleted || len(*j.Result) > protocol.MaxTextBytes || !strings.HasSuffix(*j.Result, "(truncated)") {
		t.Fatalf("job %s with a result of %d bytes", j.State, len(deref(j.Result)))
	}
}
