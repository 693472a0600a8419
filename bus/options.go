package bus

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// Defaults of a Node.
const (
	DefaultAskTimeout      = 5 * time.Second
	DefaultMaxInFlight     = 256
	DefaultReconnectBuffer = 8 << 20 // bytes of Tells kept while reconnecting
)

// Option configures a Node.
type Option func(*config)

type config struct {
	askTimeout   time.Duration
	heartbeat    time.Duration
	logger       *slog.Logger
	natsOpts     []nats.Option
	reconnectBuf int
	maxInFlight  int
	envelope     EnvelopeVersion
}

func newConfig(opts []Option) (config, error) {
	c := config{
		askTimeout:   DefaultAskTimeout,
		logger:       slog.Default(),
		reconnectBuf: DefaultReconnectBuffer,
		maxInFlight:  DefaultMaxInFlight,
		envelope:     Envelope1,
	}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.askTimeout <= 0:
		return c, fmt.Errorf("bus: ask timeout must be positive, got %v", c.askTimeout)
	case c.heartbeat < 0:
		return c, fmt.Errorf("bus: heartbeat interval must not be negative, got %v", c.heartbeat)
	case c.maxInFlight <= 0:
		return c, fmt.Errorf("bus: max in flight must be positive, got %d", c.maxInFlight)
	case c.envelope != Envelope1 && c.envelope != Envelope2:
		return c, fmt.Errorf("bus: unknown envelope version %d", c.envelope)
	case c.reconnectBuf <= 0:
		return c, fmt.Errorf("bus: reconnect buffer must be positive, got %d", c.reconnectBuf)
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// WithEnvelope sets the envelope the node sends (default Envelope1). A node reads both.
func WithEnvelope(v EnvelopeVersion) Option { return func(c *config) { c.envelope = v } }

// WithAskTimeout sets how long an ask waits when its context has no deadline
// (default 5s).
func WithAskTimeout(d time.Duration) Option { return func(c *config) { c.askTimeout = d } }

// WithHeartbeat makes the node announce its presence every interval (0, the default,
// announces nothing). Watchers (WatchPresence) use a timeout of a few intervals.
func WithHeartbeat(interval time.Duration) Option {
	return func(c *config) { c.heartbeat = interval }
}

// WithLogger sets the logger (default slog.Default(); nil discards).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithNATSOptions adds options to the connection that Connect opens; they are applied
// after the bus's own, so they win. New ignores them.
func WithNATSOptions(opts ...nats.Option) Option {
	return func(c *config) { c.natsOpts = append(c.natsOpts, opts...) }
}

// WithReconnectBuffer bounds, in bytes, what Connect's connection keeps of messages
// published while it is reconnecting (default 8 MiB); beyond it a Tell fails with
// ErrDisconnected.
func WithReconnectBuffer(bytes int) Option { return func(c *config) { c.reconnectBuf = bytes } }

// WithMaxInFlight bounds how many handlers of the node run at once (default 256). More
// messages wait in their subscriptions' buffers, whose size NATS bounds.
func WithMaxInFlight(n int) Option { return func(c *config) { c.maxInFlight = n } }

// HandleOption configures Handle.
type HandleOption func(*handleConfig)

type handleConfig struct {
	direct, role bool
	ownSlots     int // 0: the node's slots
}

// AsRole makes the handler also serve the role-wide subject, in the role's queue group,
// so that asks and tells to "any node of the role" are balanced over its nodes.
func AsRole() HandleOption { return func(h *handleConfig) { h.role = true } }

// OnlyRole makes the handler serve the role-wide subject only, not the node's own.
func OnlyRole() HandleOption { return func(h *handleConfig) { h.role, h.direct = true, false } }

// OwnSlots makes the path's handlers run in n slots of their own instead of the node's
// (WithMaxInFlight): a handler that waits long, for a write to be durable, then holds
// one of its path's slots only, and however many of them wait, the node's other paths
// are still served. More messages for the path wait in its subscriptions' buffers.
// OwnSlots(0) leaves the path on the node's slots.
func OwnSlots(n int) HandleOption { return func(h *handleConfig) { h.ownSlots = n } }
