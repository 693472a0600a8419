package attempts_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker/internal/attempts"
)

// TestKeepSparesKeptAttempts: a registration that kept some leases moves their
// attempts into its generation, so cancelling the earlier generations ends only the
// others.
func TestKeepSparesKeptAttempts(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	ctx := context.Background()
	f.start(ctx, assign("job-kept", "a", typeBlock, `{}`))
	f.start(ctx, assign("job-dropped", "a", typeBlock, `{}`))
	gen := f.set.NextGeneration()
	kept := []attempts.Lease{{JobID: "job-kept", AttemptID: "a"}, {JobID: "job-unknown", AttemptID: "a"}}
	if n := f.set.Keep(gen, kept); n != 1 {
		t.Errorf("Keep = %d, want 1 (the unknown lease is not running)", n)
	}
	abandoned := errors.New("abandoned")
	if n := f.set.CancelBefore(gen, abandoned); n != 1 {
		t.Errorf("CancelBefore = %d, want 1", n)
	}
	if o := f.outcome(t, "job-dropped", "a"); !errors.Is(o.Err, abandoned) {
		t.Errorf("outcome of the attempt not kept = %+v, want abandoned", o)
	}
	testkit.Eventually(t, 10*time.Second, "the attempt not kept forgotten", func() bool { return f.set.Len() == 1 })
	if n := len(f.outcomesOf("job-kept", "a")); n != 0 {
		t.Errorf("the kept attempt ended (%d outcomes)", n)
	}
}
