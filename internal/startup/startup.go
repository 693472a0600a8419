// Package startup retries the steps a service takes before it serves (dial NATS, ask
// JetStream for the account, open a bucket) until the cluster answers: a node started
// together with its cluster, or while a JetStream meta leader is being elected, waits
// instead of exiting, and says what it waits for.
package startup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jobbus/jobbus/internal/backoff"
)

// Backoff bounds of Wait: the first retry after about Initial, doubling up to Max, with
// jitter so that nodes started together do not ask in step.
const (
	Initial = 100 * time.Millisecond
	Max     = 2 * time.Second
)

// Each try gets its own deadline, growing from FirstTry to LastTry: a request the
// cluster dropped while it was still electing (JetStream answers nothing then) is
// asked again instead of waiting out the caller's whole context.
const (
	FirstTry = time.Second
	LastTry  = 5 * time.Second
)

// logEvery is how often a wait that goes on says so again, when the reason stays the same.
const logEvery = 10 * time.Second

// permanent marks an error that retrying cannot cure.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent wraps err so that Wait returns it at once instead of retrying.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err was wrapped by Permanent.
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}

// Wait calls try until it succeeds, returns a Permanent error, or ctx ends, sleeping a
// growing, jittered delay in between; each try has a deadline of its own (FirstTry,
// doubling up to LastTry). The first failure is logged at info ("waiting
// for <what>"), later ones when the reason changes or every 10 s, and a success after a
// failure says how long it took. It returns try's last error (unwrapped from Permanent),
// or ctx's error wrapped with the last one.
func Wait(ctx context.Context, log *slog.Logger, what string, try func(context.Context) error) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	var lastText string
	var lastLog time.Time
	b := backoff.Policy{Base: Initial, Max: Max, Jitter: 0.5}.Start()
	limit := FirstTry
	for attempt := 1; ; attempt++ {
		tctx, cancel := context.WithTimeout(ctx, limit)
		err := try(tctx)
		cancel()
		limit = min(2*limit, LastTry)
		if err == nil {
			if attempt > 1 {
				log.Info("ready: "+what, "waited", time.Since(start).Round(time.Millisecond), "attempts", attempt)
			}
			return nil
		}
		var p permanent
		if errors.As(err, &p) {
			return p.err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last error: %w)", what, ctx.Err(), err)
		}
		if text := err.Error(); text != lastText || time.Since(lastLog) >= logEvery {
			log.Info("waiting for "+what, "err", err, "attempt", attempt, "waited", time.Since(start).Round(time.Millisecond))
			lastText, lastLog = text, time.Now()
		}
		if !b.Wait(ctx) {
			return fmt.Errorf("%s: %w (last error: %w)", what, ctx.Err(), err)
		}
	}
}
