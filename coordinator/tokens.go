package coordinator

import (
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// tokenBucket is a rate limit's bucket: it holds at most burst tokens and gains count
// tokens per period; a start takes one. So in any window of length w at most
// burst + count*w/period starts pass (the bucket's content at the window's start,
// plus what it gains within it).
//
// It counts in integers so that a token is due at an exact nanosecond and never
// "almost there" (a float 0.9999 token would wake dispatch in a loop): one token is
// period units (nanoseconds of the period), and each nanosecond adds count units. The
// bounds of protocol.Rate keep burst*period within int64.
type tokenBucket struct {
	count  int64 // tokens gained per period
	period int64 // nanoseconds; also the units of one token
	burst  int64 // tokens held at most
	units  int64 // tokens held, times period
	at     time.Time
}

// newTokenBucket returns a bucket for rate and burst, holding full tokens at now:
// burst for a limit just set, 0 for one a new leader takes over (flow.go).
func newTokenBucket(r protocol.Rate, burst int64, full bool, now time.Time) *tokenBucket {
	b := &tokenBucket{count: r.Count, period: int64(r.Period), burst: max(burst, 1), at: now}
	if full {
		b.units = b.capacity()
	}
	return b
}

func (b *tokenBucket) capacity() int64 { return b.burst * b.period }

// refill adds what the time since the last refill earned.
func (b *tokenBucket) refill(now time.Time) {
	elapsed := int64(now.Sub(b.at))
	if elapsed <= 0 {
		return // the clock stepped back: wait for it, earning nothing twice
	}
	b.at = now
	need := b.capacity() - b.units
	if need <= 0 {
		return
	}
	if elapsed >= (need+b.count-1)/b.count {
		b.units = b.capacity()
		return
	}
	b.units += elapsed * b.count
}

// allow reports whether a token is there at now, and if not, when the next one is.
func (b *tokenBucket) allow(now time.Time) (ok bool, next time.Time) {
	b.refill(now)
	if b.units >= b.period {
		return true, time.Time{}
	}
	wait := (b.period - b.units + b.count - 1) / b.count
	return false, b.at.Add(time.Duration(wait))
}

// take takes a token at now, if one is there.
func (b *tokenBucket) take(now time.Time) bool {
	b.refill(now)
	if b.units < b.period {
		return false
	}
	b.units -= b.period
	return true
}

// giveBack returns the token of a start that did not happen, up to the burst.
func (b *tokenBucket) giveBack(now time.Time) {
	b.refill(now)
	b.units = min(b.units+b.period, b.capacity())
}

// tokens is how many tokens the bucket holds at now, in fractions of one.
func (b *tokenBucket) tokens(now time.Time) float64 {
	b.refill(now)
	return float64(b.units) / float64(b.period)
}

// reshape gives the bucket a new rate and burst, keeping the tokens it holds (no more
// than the new burst): changing a limit neither grants nor forfeits a burst.
func (b *tokenBucket) reshape(r protocol.Rate, burst int64, now time.Time) {
	held := b.tokens(now)
	b.count, b.period, b.burst = r.Count, int64(r.Period), max(burst, 1)
	b.units = min(int64(held*float64(b.period)), b.capacity())
	b.at = now
}
