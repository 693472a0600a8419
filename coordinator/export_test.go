package coordinator

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DiagnoseStream is diagnoseStream's words, for the external tests that need a cluster
// (internal/jobbustest imports this package).
func DiagnoseStream(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, stream string, err error, sent time.Time) string {
	return diagnoseStream(ctx, nc, js, stream, err, sent).String()
}

// FenceLeavingTheAPIUp fences the coordinator by err as a lost CAS does, but leaves its
// API served: the moment before withdraw takes it down, made to last.
func (c *Coordinator) FenceLeavingTheAPIUp(err error) {
	c.sched.mu.Lock()
	defer c.sched.mu.Unlock()
	if c.sched.fenced == nil {
		c.sched.fenced = err
	}
}

// FencedBy is why the coordinator fenced itself; nil while it did not.
func (c *Coordinator) FencedBy() error { return c.sched.fencedBy() }
