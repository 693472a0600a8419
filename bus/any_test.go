package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestHandleAny: a node's catch-all handler serves every path sent to its own address
// that no handler of its own serves, and reads the sender and the path; a second one
// is refused, and it ends with the node.
func TestHandleAny(t *testing.T) {
	t.Parallel()
	srv := startServer(t, -1)
	gw := connect(t, srv.url, bus.Address{Role: bus.RoleMu, ID: "10.0.0.5:27777"})
	asker := connect(t, srv.url, worker("w1"))
	if err := gw.HandleAny(func(_ context.Context, r *bus.Request) (any, error) {
		return map[string]string{"path": r.Path, "from": r.From.String(), "kind": string(r.Kind)}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := gw.Handle("own", func(context.Context, *bus.Request) (any, error) { return "own handler", nil }); err != nil {
		t.Fatal(err)
	}
	if err := gw.HandleAny(func(context.Context, *bus.Request) (any, error) { return nil, nil }); !errors.Is(err, bus.ErrHandled) {
		t.Fatalf("second HandleAny: %v", err)
	}
	ctx := context.Background()
	for _, path := range []string{"echo", "/worker/runJob", "a.b.c"} {
		got, err := bus.Ask[map[string]string](ctx, asker, gw.Self(), path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got["path"] != path || got["from"] != worker("w1").String() || got["kind"] != "ASK" {
			t.Fatalf("ask %s: handler saw %v", path, got)
		}
	}
	if got, err := bus.Ask[string](ctx, asker, gw.Self(), "own", nil); err != nil || got != "own handler" {
		t.Fatalf("a path with its own handler: %q, %v", got, err)
	}
	_ = gw.Close()
	// The server drops the closed connection's subscriptions when it notices: soon.
	testkit.Eventually(t, 10*time.Second, "no peer after Close", func() bool {
		ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := bus.Ask[string](ctx, asker, gw.Self(), "echo", nil)
		return errors.Is(err, bus.ErrNoPeer)
	})
}

// TestHandleAnyBesideRoleOnlyHandler: a path the node serves only for its role
// (OnlyRole) is not served on its own address, so the catch-all serves it there
// rather than nobody answering.
func TestHandleAnyBesideRoleOnlyHandler(t *testing.T) {
	t.Parallel()
	srv := startServer(t, -1)
	gw := connect(t, srv.url, worker("gw"))
	asker := connect(t, srv.url, coordinator("c1"), bus.WithAskTimeout(time.Minute))
	must(t, gw.HandleAny(func(context.Context, *bus.Request) (any, error) { return "any", nil }))
	must(t, gw.Handle("p", func(context.Context, *bus.Request) (any, error) { return "role", nil }, bus.OnlyRole()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got, err := bus.Ask[string](ctx, asker, gw.Self(), "p", nil); err != nil || got != "any" {
		t.Fatalf("ask the node's own address: %q, %v; want the catch-all's answer", got, err)
	}
	if got, err := bus.Ask[string](ctx, asker, anyOf(bus.RoleWorker), "p", nil); err != nil || got != "role" {
		t.Fatalf("ask the role: %q, %v", got, err)
	}
}
