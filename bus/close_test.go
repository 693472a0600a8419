package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestAsksQueuedAtAClosingNodeFailFast: asks that reached a node but wait for a handler
// slot when it closes are answered at once with CodeUnavailable, not left to their
// timeout.
func TestAsksQueuedAtAClosingNodeFailFast(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"), bus.WithAskTimeout(time.Minute))
	w := connect(t, s.url, worker("w1"), bus.WithMaxInFlight(1))
	entered := make(chan struct{}, 1)
	must(t, w.Handle("stuck", func(ctx context.Context, _ *bus.Request) (any, error) {
		entered <- struct{}{}
		<-ctx.Done()
		return nil, bus.WithCode(bus.CodeUnavailable, ctx.Err())
	}))
	// A probe on w's connection: once it arrives, so have the asks sent before it.
	probe := make(chan *nats.Msg, 1)
	sub, err := w.Conn().ChanSubscribe("probe.w1", probe)
	must(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	must(t, w.Conn().Flush())

	const asks = 3
	errs := make(chan error, asks)
	for range asks {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := bus.Ask[json.RawMessage](ctx, c, w.Self(), "stuck", nil)
			errs <- err
		}()
	}
	recv(t, "handler entered", entered)
	testkit.Eventually(t, 10*time.Second, "every ask sent", func() bool { return c.Stats().Sent.Ask == asks })
	must(t, c.Conn().Publish("probe.w1", nil))
	recv(t, "probe", probe)

	start := time.Now()
	must(t, w.Close())
	for range asks {
		err := recv(t, "an ask to end", errs)
		if !errors.Is(err, bus.CodeUnavailable) {
			t.Fatalf("ask at a closing node: %v, want CodeUnavailable", err)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("asks at a closing node failed after %v", took)
	}
}
