package tcpworker

import (
	"context"
	"errors"
	"fmt"
	"github.com/jobbus/jobbus/bus/protocol"
	"log/slog"
	"net"
	"time"

	"github.com/jobbus/jobbus/worker/internal/workercfg"
	"github.com/jobbus/jobbus/worker/tasks"
)

// Defaults of a Worker, those of the reference worker of PROTOCOL.md.
const (
	DefaultCapacity       = 4
	DefaultHeartbeat      = 2 * time.Second
	DefaultReconnectDelay = 2 * time.Second
	DefaultDialTimeout    = 10 * time.Second
)

// DialFunc opens a connection; (*net.Dialer).DialContext is one.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Option configures a Worker.
type Option func(*config)

type config struct {
	workercfg.Common
	reconnectDelay time.Duration
	dialTimeout    time.Duration
	dial           DialFunc
}

// WithID sets the worker id (default "worker-" and 8 random hex digits). The
// coordinator treats a registration under a live id as the same worker coming back.
func WithID(id string) Option { return func(c *config) { c.ID = id } }

// WithCapacity sets how many attempts the worker announces it runs at once (default 4,
// 1..1024). The coordinator counts the free slots; the worker runs what it is sent.
func WithCapacity(n int) Option { return func(c *config) { c.Capacity = n } }

// WithHeartbeat sets the heartbeat interval (default 2s). Keep it well below the
// coordinator's heartbeat timeout.
func WithHeartbeat(interval time.Duration) Option {
	return func(c *config) { c.Heartbeat = interval }
}

// WithReconnectDelay sets the wait before dialing again after a failed dial or a lost
// connection (default 2s).
func WithReconnectDelay(d time.Duration) Option {
	return func(c *config) { c.reconnectDelay = d }
}

// WithTasks sets the task types the worker runs (default tasks.Builtins()). A spec
// worker does not advertise them: the coordinator may send any of the five built-ins.
func WithTasks(r *tasks.Registry) Option { return func(c *config) { c.Registry = r } }

// WithQueues sets the queues the worker serves and their weights (default: the
// "default" queue only). While all of them have jobs, each gets its weight's share of
// the worker's starts (critical=6, default=3, low=1: 60/30/10); see WithStrictQueues.
func WithQueues(qs ...protocol.QueueWeight) Option {
	return func(c *config) { c.Queues = append([]protocol.QueueWeight(nil), qs...) }
}

// WithStrictQueues makes the worker take its queues in the order given to WithQueues:
// a queue's jobs only while the queues before it have none it can start.
func WithStrictQueues(strict bool) Option { return func(c *config) { c.StrictQueues = strict } }

// WithLogger sets the logger (default slog.Default(); nil discards).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.Logger = workercfg.Logger(l) }
}

// WithDialer sets how the worker connects (default a net.Dialer with TCP keep-alive).
func WithDialer(dial DialFunc) Option { return func(c *config) { c.dial = dial } }

// WithDialTimeout bounds a dial, the registration handshake that follows it, and the
// write of each frame (default 10s).
func WithDialTimeout(d time.Duration) Option { return func(c *config) { c.dialTimeout = d } }

func newConfig(addr string, opts []Option) (config, error) {
	c := config{
		Common:         workercfg.New(DefaultCapacity, DefaultHeartbeat),
		reconnectDelay: DefaultReconnectDelay,
		dialTimeout:    DefaultDialTimeout,
	}
	for _, o := range opts {
		o(&c)
	}
	c.Complete()
	if c.dial == nil {
		c.dial = (&net.Dialer{}).DialContext
	}
	return c, c.validate(addr)
}

// validate returns every problem at once.
func (c *config) validate(addr string) error {
	var errs []error
	if addr == "" {
		errs = append(errs, errors.New("address is empty"))
	}
	errs = append(errs, c.Common.Validate()...)
	// A zero delay would redial in a hot loop while the bridge is down.
	if c.reconnectDelay <= 0 {
		errs = append(errs, fmt.Errorf("reconnect delay must be positive, got %v", c.reconnectDelay))
	}
	if c.dialTimeout <= 0 {
		errs = append(errs, fmt.Errorf("dial timeout must be positive, got %v", c.dialTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tcpworker: %w", err)
	}
	return nil
}
