package backoff_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/internal/backoff"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// draws is how many times each jittered delay is drawn: enough that a draw outside
// its bounds, or one that never varies, would show.
const draws = 2000

func TestCeilingDoublesUpToTheCap(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		policy backoff.Policy
		want   []time.Duration // delays 0, 1, 2, ...
	}{
		{"Doubles", backoff.Policy{Base: 10, Max: 1000}, []time.Duration{10, 20, 40, 80, 160, 320, 640, 1000, 1000}},
		{"CapBetweenDoublings", backoff.Policy{Base: 10, Max: 35}, []time.Duration{10, 20, 35, 35, 35}},
		{"BaseAboveCap", backoff.Policy{Base: 50, Max: 20}, []time.Duration{20, 20, 20}},
		{"Constant", backoff.Policy{Base: 7, Max: 7}, []time.Duration{7, 7, 7}},
		{"NoBase", backoff.Policy{Max: 100}, []time.Duration{0, 0, 0}},
		{"NoCap", backoff.Policy{Base: 100}, []time.Duration{0, 0}},
		{"NoOverflow", backoff.Policy{Base: time.Second, Max: math.MaxInt64}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for n, want := range tt.want {
				if got := tt.policy.Ceiling(n); got != want {
					t.Fatalf("Ceiling(%d) = %v, want %v", n, got, want)
				}
			}
			// However many retries: never past the cap, never negative, never less
			// than the delay before.
			prev := time.Duration(0)
			for _, n := range []int{0, 1, 10, 40, 62, 63, 64, 100, 1 << 20, math.MaxInt} {
				d := tt.policy.Ceiling(n)
				if d < prev || d < 0 || d > max(tt.policy.Max, 0) {
					t.Fatalf("Ceiling(%d) = %v after %v (cap %v)", n, d, prev, tt.policy.Max)
				}
				prev = d
			}
		})
	}
}

func TestDelayDrawsWithinItsBounds(t *testing.T) {
	t.Parallel()
	const base, cap = 100 * time.Millisecond, 2 * time.Second
	tests := []struct {
		jitter float64
		// bounds of delay n as fractions of its ceiling d: [lo·d, hi·d]
		lo, hi float64
		varies bool
	}{
		{0, 1, 1, false},      // the delay itself: workers, the bridge, natsreq
		{0.5, 0.5, 1, true},   // equal jitter: startup
		{1, 0, 1, true},       // full jitter: the client's submit retries
		{-1, 1, 1, false},     // out of range: as 0
		{2, 0, 1, true},       // out of range: as 1
		{0.25, 0.75, 1, true}, // any part
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint("Jitter", tt.jitter), func(t *testing.T) {
			t.Parallel()
			p := backoff.Policy{Base: base, Max: cap, Jitter: tt.jitter}
			for n := range 8 {
				d := p.Ceiling(n)
				lo, hi := time.Duration(tt.lo*float64(d)), time.Duration(tt.hi*float64(d))
				seen := map[time.Duration]bool{}
				for range draws {
					got := p.Delay(n)
					if got < lo || got > hi || tt.jitter > 0 && got >= d {
						t.Fatalf("Delay(%d) = %v, want in [%v, %v] (ceiling %v)", n, got, lo, hi, d)
					}
					seen[got] = true
				}
				if varies := len(seen) > 1; varies != tt.varies {
					t.Fatalf("Delay(%d) drew %d distinct values in %d draws", n, len(seen), draws)
				}
			}
		})
	}
}

func TestBackoffWalksThePolicy(t *testing.T) {
	t.Parallel()
	b := backoff.Policy{Base: 10, Max: 35}.Start()
	var got []time.Duration
	for range 5 {
		got = append(got, b.Next())
	}
	b.Reset()
	got = append(got, b.Next())
	if fmt.Sprint(got) != "[10ns 20ns 35ns 35ns 35ns 10ns]" {
		t.Fatalf("delays %v", got)
	}
	// Full jitter: every draw under the ceiling of its retry.
	j := backoff.Policy{Base: 10 * time.Millisecond, Max: time.Second, Jitter: 1}.Start()
	p := backoff.Policy{Base: 10 * time.Millisecond, Max: time.Second}
	for n := range 1000 {
		if d := j.Next(); d < 0 || d >= p.Ceiling(n) {
			t.Fatalf("draw %d: %v, ceiling %v", n, d, p.Ceiling(n))
		}
	}
}

func TestSleep(t *testing.T) {
	t.Parallel()
	t.Run("WaitsTheDelay", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		if !backoff.Sleep(context.Background(), 20*time.Millisecond) {
			t.Fatal("Sleep reported a cancel")
		}
		if waited := time.Since(start); waited < 20*time.Millisecond {
			t.Fatalf("waited %v", waited)
		}
	})
	t.Run("CancelledBeforeReturnsAtOnce", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for _, d := range []time.Duration{0, time.Hour} {
			start := time.Now()
			if backoff.Sleep(ctx, d) {
				t.Fatalf("Sleep(%v) on a cancelled context reported a full wait", d)
			}
			if waited := time.Since(start); waited > time.Second {
				t.Fatalf("Sleep(%v) took %v", d, waited)
			}
		}
	})
	t.Run("CancelDuringReturnsAtOnce", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		b := backoff.Policy{Base: time.Hour, Max: time.Hour}.Start()
		done := make(chan bool)
		go func() { done <- b.Wait(ctx) }()
		cancel()
		select {
		case full := <-done:
			if full {
				t.Fatal("Wait reported a full wait")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Wait did not return after its context ended")
		}
	})
}
