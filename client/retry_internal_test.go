package client

import (
	"testing"
	"time"
)

func TestBackoffIsFullJitterUnderTheCap(t *testing.T) {
	t.Parallel()
	r := submitRetry{n: 100, base: 200 * time.Millisecond, max: 5 * time.Second}
	for i, ceil := range []time.Duration{200, 400, 800, 1600, 3200, 5000, 5000} {
		ceil *= time.Millisecond
		var top time.Duration
		for range 2000 {
			d := r.backoff(i)
			if d < 0 || d >= ceil {
				t.Fatalf("backoff(%d) = %v, want in [0, %v)", i, d, ceil)
			}
			top = max(top, d)
		}
		// 2000 uniform draws all in the lower half has probability 2^-2000.
		if top < ceil/2 {
			t.Errorf("backoff(%d) never above %v: not spread over [0, %v)", i, top, ceil)
		}
	}
	if d := r.backoff(1 << 20); d < 0 || d >= r.max {
		t.Fatalf("backoff of a huge retry count = %v, want in [0, %v)", d, r.max)
	}
}

func TestWithSubmitRetriesDefaults(t *testing.T) {
	t.Parallel()
	c := NewWithTransport(nil, WithSubmitRetries(3, 0, 0))
	if c.retry != (submitRetry{n: 3, base: DefaultSubmitRetryBase, max: DefaultSubmitRetryMax}) {
		t.Fatalf("retry policy %+v", c.retry)
	}
	if c := NewWithTransport(nil); c.retry.n != 0 {
		t.Fatalf("retries on by default: %+v", c.retry)
	}
}
