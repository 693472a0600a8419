package coordinator

import (
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

func TestTokenBucketBurstThenRate(t *testing.T) {
	t.Parallel()
	t0 := time.UnixMilli(1_700_000_000_000)
	b := newTokenBucket(protocol.Rate{Count: 100, Period: time.Second}, 10, true, t0)
	for i := range 10 {
		if !b.take(t0) {
			t.Fatalf("take %d of a full bucket of 10 refused", i+1)
		}
	}
	ok, next := b.allow(t0)
	if ok || !next.Equal(t0.Add(10*time.Millisecond)) {
		t.Fatalf("empty bucket: allow = %v, next %v; want refused until +10ms", ok, next.Sub(t0))
	}
	if b.take(t0.Add(10*time.Millisecond - 1)) {
		t.Fatal("a token taken a nanosecond before it was due")
	}
	if !b.take(t0.Add(10 * time.Millisecond)) {
		t.Fatal("the token due at +10ms was refused")
	}
}

func TestTokenBucketStartsEmpty(t *testing.T) {
	t.Parallel()
	t0 := time.UnixMilli(1_700_000_000_000)
	// 7 a minute: a token every 8.571428571... s, due at the first whole nanosecond.
	b := newTokenBucket(protocol.Rate{Count: 7, Period: time.Minute}, 3, false, t0)
	ok, next := b.allow(t0)
	want := t0.Add(8571428572) // ceil(60e9/7)
	if ok || !next.Equal(want) {
		t.Fatalf("allow = %v, next +%v; want refused until +%v", ok, next.Sub(t0), want.Sub(t0))
	}
	if b.take(want.Add(-1)) || !b.take(want) {
		t.Fatal("the first token of an empty bucket is not due exactly when allow said")
	}
	if got := b.tokens(t0.Add(time.Hour)); got != 3 {
		t.Fatalf("after an hour the bucket holds %v tokens, want its burst 3", got)
	}
}

func TestTokenBucketClockBack(t *testing.T) {
	t.Parallel()
	t0 := time.UnixMilli(1_700_000_000_000)
	b := newTokenBucket(protocol.Rate{Count: 1, Period: time.Second}, 1, true, t0)
	if !b.take(t0) {
		t.Fatal("full bucket refused")
	}
	// The clock steps back a minute and forward again: nothing is earned twice.
	if b.take(t0.Add(-time.Minute)) || b.take(t0.Add(999*time.Millisecond)) {
		t.Fatal("a token appeared before a second had passed since the last")
	}
	if !b.take(t0.Add(time.Second)) {
		t.Fatal("the token due a second later was refused")
	}
}

func TestTokenBucketReshape(t *testing.T) {
	t.Parallel()
	t0 := time.UnixMilli(1_700_000_000_000)
	b := newTokenBucket(protocol.Rate{Count: 10, Period: time.Second}, 50, true, t0)
	b.reshape(protocol.Rate{Count: 1, Period: time.Second}, 5, t0)
	if got := b.tokens(t0); got != 5 {
		t.Fatalf("a full bucket of 50 reshaped to burst 5 holds %v, want 5", got)
	}
	for range 5 {
		b.take(t0)
	}
	b.reshape(protocol.Rate{Count: 100, Period: time.Second}, 100, t0)
	if got := b.tokens(t0); got != 0 {
		t.Fatalf("an empty bucket reshaped holds %v, want 0: a new limit grants no burst", got)
	}
	if ok, next := b.allow(t0); ok || !next.Equal(t0.Add(10*time.Millisecond)) {
		t.Fatalf("reshaped to 100/s: allow = %v, next +%v; want +10ms", ok, next.Sub(t0))
	}
}

// TestTokenBucketWindowBound starts greedily (whenever allow says a token is due) for
// a minute and checks the bound the bucket promises: in any window of length w, at most
// burst + rate*w starts; over the minute, rate*60s + burst.
func TestTokenBucketWindowBound(t *testing.T) {
	t.Parallel()
	cases := []struct {
		rate  protocol.Rate
		burst int64
		full  bool
	}{
		{protocol.Rate{Count: 100, Period: time.Second}, 10, true},
		{protocol.Rate{Count: 100, Period: time.Second}, 10, false},
		{protocol.Rate{Count: 6000, Period: time.Minute}, 1, true},
		{protocol.Rate{Count: 3, Period: 70 * time.Millisecond}, 7, true},
	}
	for _, c := range cases {
		t0 := time.UnixMilli(1_700_000_000_000)
		b := newTokenBucket(c.rate, c.burst, c.full, t0)
		var starts []time.Time
		now := t0
		end := t0.Add(time.Minute)
		for now.Before(end) {
			if b.take(now) {
				starts = append(starts, now)
				continue
			}
			_, next := b.allow(now)
			if !next.After(now) {
				t.Fatalf("%v: allow refused with next %v not after now", c.rate, next)
			}
			now = next
		}
		perMinute := c.rate.Count * int64(time.Minute/c.rate.Period)
		want := perMinute
		if c.full {
			want += c.burst
		}
		if n := int64(len(starts)); n < want-1 || n > want {
			t.Errorf("%v burst %d full %v: %d starts in a minute, want %d", c.rate, c.burst, c.full, n, want)
		}
		// Every window of one period, and of one second, from each start.
		for _, w := range []time.Duration{c.rate.Period, time.Second} {
			limit := c.burst + int64(float64(c.rate.Count)*float64(w)/float64(c.rate.Period))
			j := 0
			for i := range starts {
				for j < len(starts) && starts[j].Sub(starts[i]) < w {
					j++
				}
				if n := int64(j - i); n > limit {
					t.Fatalf("%v burst %d: %d starts within %v from +%v, more than burst+rate = %d", c.rate, c.burst, n, w, starts[i].Sub(t0), limit)
				}
			}
		}
	}
}
