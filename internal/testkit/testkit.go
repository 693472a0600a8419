// Package testkit holds the test helpers every jobbus package may use: it imports only
// the standard library, goleak and the leaf internal/backoff, so leaf packages can use
// it without linking the whole system, as internal/jobbustest does.
package testkit

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/internal/backoff"
)

// Wait polls check, backing off from 1 ms to 50 ms, until it returns nil, and fails the
// test with the last error check returned if limit passes first (nats.go's checkFor):
// a failure says why the wait timed out, not only that it did.
func Wait(t testing.TB, limit time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for poll := (backoff.Policy{Base: time.Millisecond, Max: 50 * time.Millisecond}).Start(); ; {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %v", limit, err)
		}
		time.Sleep(poll.Next())
	}
}

// Eventually waits until cond holds, failing the test with "waiting for <what>" if
// limit passes first.
func Eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	notYet := errors.New("waiting for " + what)
	Wait(t, limit, func() error {
		if cond() {
			return nil
		}
		return notYet
	})
}

// IgnoreJetStreamAckWatcher is the goleak option for one goroutine of nats.go's
// jetstream package: the watcher its first asynchronous publish (an object store Put,
// as the coordinator's checkpoint at Close) starts, which ends only on the
// connection's CLOSED event. When that publish races the connection's Close, the
// watcher subscribes after CLOSED was sent and waits for ever (nats.go v1.55,
// jetstream/publish.go newAsyncReply); the connection itself is gone, and a leaked
// connection would still show in its read and flush goroutines, which goleak checks.
func IgnoreJetStreamAckWatcher() goleak.Option {
	return goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect")
}
