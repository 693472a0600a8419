// Package jobctx carries what a native worker gives a running attempt beyond its
// payload: where its progress and its log go. The worker puts a Scope in the handler's
// context; worker.Progress and worker.Logger (and the built-in tasks) find it there. A
// context without one (a spec TCP worker's, a test's) reports and logs nothing.
package jobctx

import (
	"context"
	"log/slog"
)

// Scope is one attempt's progress and log.
type Scope interface {
	// Progress reports the attempt's latest progress, a fraction in 0..1, and a short
	// message; the worker coalesces reports, so it may be called as often as wanted.
	Progress(fraction float64, message string)
	// Logger is the attempt's log: what it writes is kept with the job.
	Logger() *slog.Logger
}

type key struct{}

// With is ctx carrying s.
func With(ctx context.Context, s Scope) context.Context { return context.WithValue(ctx, key{}, s) }

// IsKey reports whether k is the key a Scope is found under, for a context type that
// carries its Scope itself (the native worker's attempt context, one allocation where
// With would add another): its Value answers its Scope for such a key.
func IsKey(k any) bool {
	_, ok := k.(key)
	return ok
}

// From is the Scope in ctx, or nil.
func From(ctx context.Context) Scope {
	s, _ := ctx.Value(key{}).(Scope)
	return s
}

// Progress reports progress to the Scope in ctx, if any.
func Progress(ctx context.Context, fraction float64, message string) {
	if s := From(ctx); s != nil {
		s.Progress(fraction, message)
	}
}

// discard is the logger of a context without a Scope.
var discard = slog.New(slog.DiscardHandler)

// Logger is the logger of the Scope in ctx, or one that discards.
func Logger(ctx context.Context) *slog.Logger {
	if s := From(ctx); s != nil {
		return s.Logger()
	}
	return discard
}

// Reporting reports whether ctx has a Scope, so that a task can skip work (a ticker)
// that only feeds progress.
func Reporting(ctx context.Context) bool { return From(ctx) != nil }
