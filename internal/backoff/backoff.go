// Package backoff is how jobbus waits between retries: a delay that starts at a base
// and doubles up to a cap, drawn with jitter where many callers could otherwise retry
// in step, and a wait that ends at once when its context does. It is a leaf: it
// imports nothing of jobbus.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy shapes the delays of a retry loop: retry n (from 0) waits
// min(Max, Base·2^n), of which the Jitter part is drawn at random.
type Policy struct {
	// Base is the first delay; each later one doubles, up to Max.
	Base, Max time.Duration
	// Jitter is the part of each delay drawn at random, from 0 to 1: 0 waits the
	// delay d itself; 1 ("full jitter") a time uniform in [0, d); 0.5 ("equal
	// jitter") d/2 plus a time uniform in [0, d/2).
	Jitter float64
}

// Ceiling is delay n (from 0) before jitter: min(Max, Base·2^n), without overflow,
// and never negative.
func (p Policy) Ceiling(n int) time.Duration {
	d := min(p.Base, p.Max)
	if d <= 0 {
		return 0
	}
	for ; n > 0 && d < p.Max; n-- {
		if d > p.Max/2 { // doubling would pass Max, or overflow
			return p.Max
		}
		d *= 2
	}
	return d
}

// Delay is delay n (from 0), drawn with the policy's jitter.
func (p Policy) Delay(n int) time.Duration {
	d := p.Ceiling(n)
	random := time.Duration(float64(d) * min(max(p.Jitter, 0), 1))
	if random <= 0 {
		return d
	}
	return d - random + rand.N(random)
}

// Start returns a Backoff at the policy's first delay.
func (p Policy) Start() Backoff { return Backoff{p: p} }

// Backoff walks a policy's delays, one retry after the other.
type Backoff struct {
	p Policy
	n int
}

// Next returns the next delay.
func (b *Backoff) Next() time.Duration {
	d := b.p.Delay(b.n)
	if b.p.Ceiling(b.n) < b.p.Max {
		b.n++ // past Max, n stays: the delays no longer change
	}
	return d
}

// Reset makes the next delay the first again.
func (b *Backoff) Reset() { b.n = 0 }

// Wait waits the next delay, reporting false as soon as ctx ends.
func (b *Backoff) Wait(ctx context.Context) bool { return Sleep(ctx, b.Next()) }

// Sleep waits d, reporting false as soon as ctx ends (at once if it has already).
func Sleep(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
