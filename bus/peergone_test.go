package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestAskToALeavingNodeFailsFast: an ask to one node that presence (watched on the
// asking node) sees leave fails at once with CodeUnavailable, whether the node said
// goodbye or went silent (killed: its connection closed, no goodbye), rather than
// waiting out the ask timeout; an ask to its role is left to its timeout, as another
// node may have taken it.
func TestAskToALeavingNodeFailsFast(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		timeout time.Duration // the watcher's
		leave   func(t *testing.T, w *bus.Node)
	}{
		{"Killed", 100 * time.Millisecond, func(_ *testing.T, w *bus.Node) { w.Conn().Close() }},
		// A timeout far beyond the test: only the goodbye can explain the leave.
		{"Goodbye", time.Hour, func(t *testing.T, w *bus.Node) {
			m := nats.NewMsg("jobbus.presence.worker.w1")
			m.Header.Set(bus.HeaderKind, string(bus.KindHeartbeat))
			m.Header.Set(bus.HeaderFrom, w.Self().String())
			m.Header.Set(bus.HeaderPresence, "leave")
			must(t, w.Conn().PublishMsg(m))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startServer(t, -1)
			c := connect(t, s.url, coordinator("c1"), bus.WithAskTimeout(time.Minute))
			joined := make(chan bus.Address, 1)
			p, err := bus.WatchPresence(c, bus.RoleWorker, tc.timeout, func(a bus.Address) { joined <- a }, nil)
			must(t, err)
			t.Cleanup(func() { _ = p.Close() })
			w := connect(t, s.url, worker("w1"), bus.WithHeartbeat(10*time.Millisecond))
			entered := make(chan struct{}, 2)
			must(t, w.Handle("hang", func(ctx context.Context, _ *bus.Request) (any, error) {
				entered <- struct{}{}
				<-ctx.Done()
				return nil, ctx.Err()
			}, bus.AsRole()))
			recv(t, "join", joined)

			// No deadline: the ask timeout (a minute) bounds them.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			direct, role := make(chan error, 1), make(chan error, 1)
			go func() { _, err := bus.Ask[string](ctx, c, w.Self(), "hang", nil); direct <- err }()
			go func() { _, err := bus.Ask[string](ctx, c, anyOf(bus.RoleWorker), "hang", nil); role <- err }()
			recv(t, "handler entered", entered)
			recv(t, "handler entered", entered)

			start := time.Now()
			tc.leave(t, w)
			select {
			case err := <-direct:
				if !errors.Is(err, bus.CodeUnavailable) || errors.Is(err, bus.ErrTimeout) {
					t.Fatalf("ask to a node that left: %v, want CodeUnavailable", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("ask to a node that left still waits %v after it left", time.Since(start))
			}
			// The leave removed every ask it fails before failing any: the role's ask
			// still waits, and ends with its context.
			cancel()
			if err := recv(t, "the role's ask", role); !errors.Is(err, bus.ErrTimeout) || !errors.Is(err, context.Canceled) {
				t.Fatalf("ask to the role of a node that left: %v, want ErrTimeout (its context's end)", err)
			}
		})
	}
}

// TestAnswerBeforeGoodbyeIsKept: a handler still running when its node closes answers
// before the node says goodbye, so an asker that watches the node's presence takes the
// answer rather than failing the ask at the goodbye.
func TestAnswerBeforeGoodbyeIsKept(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"), bus.WithAskTimeout(time.Minute))
	joined, left := make(chan bus.Address, 1), make(chan bus.Address, 1)
	p, err := bus.WatchPresence(c, bus.RoleWorker, time.Hour,
		func(a bus.Address) { joined <- a }, func(a bus.Address) { left <- a })
	must(t, err)
	t.Cleanup(func() { _ = p.Close() })
	w := connect(t, s.url, worker("w1"), bus.WithHeartbeat(10*time.Millisecond))
	entered := make(chan struct{}, 1)
	must(t, w.Handle("finish", func(ctx context.Context, _ *bus.Request) (any, error) {
		entered <- struct{}{}
		<-ctx.Done()
		// A goodbye sent now, before this answer, would fail the ask: give it the
		// time to arrive (the test fails if it does).
		select {
		case <-left:
		case <-time.After(300 * time.Millisecond):
		}
		return "finished", nil
	}))
	recv(t, "join", joined)
	answer := make(chan error, 1)
	go func() {
		got, err := bus.Ask[string](context.Background(), c, w.Self(), "finish", nil)
		if err == nil && got != "finished" {
			err = errors.New("answered " + got)
		}
		answer <- err
	}()
	recv(t, "handler entered", entered)
	closed := make(chan error, 1)
	go func() { closed <- w.Close() }()
	if err := recv(t, "the answer", answer); err != nil {
		t.Fatalf("ask answered while its node closes: %v, want the handler's answer", err)
	}
	must(t, recv(t, "Close", closed))
	testkit.Eventually(t, 10*time.Second, "the goodbye", func() bool { return len(p.Alive()) == 0 })
}
