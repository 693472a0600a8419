package bus_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/internal/testkit"
)

// events records presence callbacks.
type events struct {
	mu     sync.Mutex
	joined []bus.Address
	left   []bus.Address
}

func (e *events) join(a bus.Address)  { e.mu.Lock(); e.joined = append(e.joined, a); e.mu.Unlock() }
func (e *events) leave(a bus.Address) { e.mu.Lock(); e.left = append(e.left, a); e.mu.Unlock() }

func (e *events) has(joined bool, a bus.Address) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if joined {
		return slices.Contains(e.joined, a)
	}
	return slices.Contains(e.left, a)
}

func TestPresence(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		timeout time.Duration
		// leave makes the worker go away.
		leave func(t *testing.T, w *bus.Node)
	}{
		// A timeout far beyond the test: only the goodbye can explain the leave.
		{"LeavesByGoodbye", time.Hour, func(t *testing.T, w *bus.Node) { must(t, w.Close()) }},
		// The connection drops without a goodbye: the worker goes silent.
		{"LeavesBySilence", 150 * time.Millisecond, func(t *testing.T, w *bus.Node) { w.Conn().Close() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := startServer(t, -1)
			c := connect(t, s.url, coordinator("c1"))
			var ev events
			p, err := bus.WatchPresence(c, bus.RoleWorker, tt.timeout, ev.join, ev.leave)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			stays := connect(t, s.url, worker("stays"), bus.WithHeartbeat(20*time.Millisecond))
			goes := connect(t, s.url, worker("goes.away"), bus.WithHeartbeat(20*time.Millisecond))
			connect(t, s.url, coordinator("c2"), bus.WithHeartbeat(20*time.Millisecond)) // another role

			testkit.Eventually(t, 10*time.Second, "both workers to join", func() bool {
				return ev.has(true, stays.Self()) && ev.has(true, goes.Self())
			})
			if got := p.Alive(); !slices.Equal(got, []bus.Address{goes.Self(), stays.Self()}) {
				t.Fatalf("Alive() = %v", got)
			}
			tt.leave(t, goes)
			testkit.Eventually(t, 10*time.Second, "the worker to leave", func() bool { return ev.has(false, goes.Self()) })
			if got := p.Alive(); !slices.Equal(got, []bus.Address{stays.Self()}) {
				t.Fatalf("Alive() after leave = %v", got)
			}
			if ev.has(false, stays.Self()) {
				t.Fatal("the worker that stayed left")
			}
			ev.mu.Lock()
			joins := len(ev.joined)
			ev.mu.Unlock()
			if joins != 2 {
				t.Fatalf("%d joins, want 2 (one per worker, none for the coordinator)", joins)
			}
		})
	}
}

// TestPresenceRejoin: a node heard again after leaving joins again, and the watcher
// ends with its node.
func TestPresenceRejoin(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	c := connect(t, s.url, coordinator("c1"))
	var ev events
	joins := make(chan bus.Address, 10)
	_, err := bus.WatchPresence(c, bus.RoleWorker, time.Hour, func(a bus.Address) { joins <- a }, ev.leave)
	if err != nil {
		t.Fatal(err)
	}
	w := connect(t, s.url, worker("w1"), bus.WithHeartbeat(20*time.Millisecond))
	recv(t, "join", joins)
	must(t, w.Close())
	testkit.Eventually(t, 10*time.Second, "leave", func() bool { return ev.has(false, worker("w1")) })
	connect(t, s.url, worker("w1"), bus.WithHeartbeat(20*time.Millisecond))
	if a := recv(t, "second join", joins); a != worker("w1") {
		t.Fatalf("joined %v", a)
	}
	must(t, c.Close()) // closes the watcher too; goleak checks its goroutine ended
	if _, err := bus.WatchPresence(c, bus.RoleWorker, time.Second, nil, nil); err == nil {
		t.Fatal("WatchPresence on a closed node succeeded")
	}
}
