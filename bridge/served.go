package bridge

import (
	"context"
	"time"
)

// untilServed calls ask until it fails otherwise than unserved says (nobody serves
// the request: a coordinator is starting, or failing over), asking again after 10 ms,
// doubling to 250 ms, until ctx ends. An ask nobody received cannot have been acted
// on, so asking again is safe. When the time runs out while asking again, the error is
// the last unserved one, not the timeout.
func untilServed[T any](ctx context.Context, unserved func(error) bool, ask func() (T, error)) (T, error) {
	var none T
	var last error
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 250*time.Millisecond) {
		v, err := ask()
		switch {
		case err != nil && unserved(err):
			last = err
		case err != nil && last != nil && ctx.Err() != nil:
			return none, last
		default:
			return v, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return none, last
		case <-t.C:
		}
	}
}
