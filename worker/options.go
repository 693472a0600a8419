package worker

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/worker/tasks"
)

// Defaults of a Worker.
const (
	DefaultCapacity        = 4
	DefaultHeartbeat       = 2 * time.Second
	DefaultRetryBase       = 50 * time.Millisecond
	DefaultRetryMax        = 2 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
)

// Option configures a Worker.
type Option func(*config)

type config struct {
	id              string
	capacity        int
	heartbeat       time.Duration
	registry        *tasks.Registry
	logger          *slog.Logger
	retryBase       time.Duration
	retryMax        time.Duration
	shutdownTimeout time.Duration
	busOpts         []bus.Option
}

// WithID sets the worker id (default "worker-" and 8 random hex digits). The
// coordinator treats a registration under a live id as the same worker coming back.
func WithID(id string) Option { return func(c *config) { c.id = id } }

// WithCapacity sets how many attempts the worker runs at once (default 4, 1..1024).
func WithCapacity(n int) Option { return func(c *config) { c.capacity = n } }

// WithHeartbeat sets the heartbeat interval (default 2s). Keep it well below the
// coordinator's heartbeat timeout.
func WithHeartbeat(interval time.Duration) Option {
	return func(c *config) { c.heartbeat = interval }
}

// WithTasks sets the task types the worker runs (default tasks.Builtins()). The worker
// advertises their names when it registers.
func WithTasks(r *tasks.Registry) Option { return func(c *config) { c.registry = r } }

// WithLogger sets the logger of the worker and of its bus node (default slog.Default();
// nil discards).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		c.logger = l
	}
}

// WithResultRetry sets the backoff between attempts to deliver a result: base, doubling
// up to max (default 50ms to 2s). Registration attempts use the same backoff.
func WithResultRetry(base, max time.Duration) Option {
	return func(c *config) { c.retryBase, c.retryMax = base, max }
}

// WithShutdownTimeout bounds how long Run, once its context ends, keeps delivering the
// results of attempts that finished (default 10s).
func WithShutdownTimeout(d time.Duration) Option {
	return func(c *config) { c.shutdownTimeout = d }
}

// WithBusOptions adds options of the worker's bus node, e.g. bus.WithAskTimeout, or
// bus.WithNATSOptions for Connect. They apply after the worker's own (its logger).
func WithBusOptions(opts ...bus.Option) Option {
	return func(c *config) { c.busOpts = append(c.busOpts, opts...) }
}

func newConfig(opts []Option) (config, error) {
	c := config{
		capacity:        DefaultCapacity,
		heartbeat:       DefaultHeartbeat,
		logger:          slog.Default(),
		retryBase:       DefaultRetryBase,
		retryMax:        DefaultRetryMax,
		shutdownTimeout: DefaultShutdownTimeout,
	}
	for _, o := range opts {
		o(&c)
	}
	if c.id == "" {
		c.id = randomID()
	}
	if c.registry == nil {
		c.registry = tasks.Builtins()
	}
	return c, c.validate()
}

// validate returns every problem at once.
func (c *config) validate() error {
	var errs []error
	if c.capacity < protocol.MinCapacity || c.capacity > protocol.MaxCapacity {
		errs = append(errs, fmt.Errorf("capacity must be in %d..%d, got %d",
			protocol.MinCapacity, protocol.MaxCapacity, c.capacity))
	}
	if c.heartbeat <= 0 {
		errs = append(errs, fmt.Errorf("heartbeat interval must be positive, got %v", c.heartbeat))
	}
	if c.retryBase <= 0 || c.retryMax < c.retryBase {
		errs = append(errs, fmt.Errorf("result retry needs 0 < base <= max, got %v and %v", c.retryBase, c.retryMax))
	}
	if c.shutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("shutdown timeout must not be negative, got %v", c.shutdownTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// randomID is "worker-" and 8 hex digits.
func randomID() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "worker-" + hex.EncodeToString(b[:])
}

// backoff yields retry delays: base, doubling up to max.
type backoff struct {
	next, max time.Duration
}

func (b *backoff) delay() time.Duration {
	d := b.next
	b.next = min(2*b.next, b.max)
	return d
}
