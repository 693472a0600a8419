package coordinator_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// TestListIsBounded fills the coordinator with more jobs than fit in one reply: a list
// without a limit holds the newest that fit in 1 MiB, and paging with limit and cursor
// visits every job once, newest first.
func TestListIsBounded(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		s := setup(t, tr)
		ctx := context.Background()
		const n = 4500 // cancelled, with their error text, their snapshots make about 1.2 MiB
		ids := make([]string, n)
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 8 {
					id, err := s.client.Submit(ctx, "SHA256", text("x"))
					if err == nil {
						// Cancelled jobs carry an error text, which makes their snapshots larger.
						_, _, err = s.client.Cancel(ctx, id)
					}
					if err != nil {
						t.Error(err)
						return
					}
					ids[i] = id
				}
			}()
		}
		wg.Wait()

		raw, err := s.client.DoRaw(ctx, protocol.TypeListJobs, []byte(`{"type":"LIST_JOBS"}`))
		must(t, err)
		if len(raw) > protocol.MaxMessage {
			t.Fatalf("JOB_LIST of %d bytes exceeds %d", len(raw), protocol.MaxMessage)
		}
		m, err := protocol.Decode(raw)
		must(t, err)
		all := m.(*protocol.JobList)
		if len(all.Jobs) == 0 || len(all.Jobs) == n || len(raw) < protocol.MaxMessage-1024 || all.NextCursor != "" {
			t.Fatalf("%d of %d jobs in %d bytes (cursor %q): want the newest that fill 1 MiB, and no cursor for a spec peer", len(all.Jobs), n, len(raw), all.NextCursor)
		}

		// A state filter is read like the CLI's --state: case-insensitively.
		cancelled := protocol.State("cancelled")
		filtered, err := s.client.List(ctx, protocol.ListJobs{State: &cancelled, Limit: 10})
		must(t, err)
		if len(filtered.Jobs) != 10 || filtered.Jobs[0].State != protocol.StateCancelled {
			t.Fatalf("list of state %q: %d jobs", cancelled, len(filtered.Jobs))
		}
		bogus := protocol.State("DONE")
		if _, err := s.client.List(ctx, protocol.ListJobs{State: &bogus}); err == nil || !strings.Contains(err.Error(), "Invalid state") {
			t.Fatalf("list of an unknown state: %v", err)
		}

		seen := map[string]bool{}
		var last int64 = 1 << 62
		req := protocol.ListJobs{Limit: 250}
		for pages := 0; ; pages++ {
			page, err := s.client.List(ctx, req)
			must(t, err)
			for _, j := range page.Jobs {
				if seen[j.JobID] {
					t.Fatalf("job %s listed twice", j.JobID)
				}
				seen[j.JobID] = true
				if j.CreatedAtMillis > last {
					t.Fatalf("page not newest first")
				}
				last = j.CreatedAtMillis
			}
			if page.NextCursor == "" {
				break
			}
			req.Cursor = page.NextCursor
			if pages > n {
				t.Fatal("paging does not end")
			}
		}
		if len(seen) != n {
			t.Fatalf("paging visited %d of %d jobs", len(seen), n)
		}
		if first := all.Jobs[0].JobID; !seen[first] {
			t.Fatalf("unbounded list's newest job %s unknown", first)
		}
	})
}

// TestSubmissionBounds: what would not fit in a job record is refused up front, and so
// is an empty idempotency key, which cannot tell submissions apart.
func TestSubmissionBounds(t *testing.T) {
	t.Parallel()
	s := setup(t, transports[0])
	ctx := context.Background()
	big := `{"text":"x","pad":"` + strings.Repeat("p", protocol.MaxPayloadBytes) + `"}`
	if _, err := s.client.Submit(ctx, "SHA256", rawJSON(big)); err == nil || !strings.Contains(err.Error(), "Payload exceeds") {
		t.Fatalf("oversized payload: %v", err)
	}
	for _, key := range []string{"", strings.Repeat("k", protocol.MaxKeyBytes+1)} {
		_, err := s.client.Submit(ctx, "SHA256", text("x"), client.IdempotencyKey(key))
		if !errors.Is(err, client.ErrServer) || !strings.Contains(err.Error(), "Idempotency key must be 1 to 1024 bytes") {
			t.Fatalf("key of %d bytes: %v", len(key), err)
		}
	}
	a, err := s.client.Submit(ctx, "SHA256", text("x"), client.IdempotencyKey(strings.Repeat("k", protocol.MaxKeyBytes)))
	must(t, err)
	// A worker's huge result is cut to fit.
	m := s.manualWorker("w", 1)
	asg := s.nextAssign(m)
	s.accept(m, asg, true, strings.Repeat("r", 2*protocol.MaxTextBytes))
	j := s.status(a)
	if j.State != protocol.StateCompleted || len(*j.Result) > protocol.MaxTextBytes || !strings.HasSuffix(*j.Result, "(truncated)") {
		t.Fatalf("job %s with a result of %d bytes", j.State, len(deref(j.Result)))
	}
}
