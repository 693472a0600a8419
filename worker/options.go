package worker

import (
	"errors"
	"fmt"
	"github.com/jobbus/jobbus/bus/protocol"
	"log/slog"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/internal/backoff"
	"github.com/jobbus/jobbus/internal/tracing"
	"github.com/jobbus/jobbus/worker/internal/workercfg"
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
	workercfg.Common
	retryBase       time.Duration
	retryMax        time.Duration
	shutdownTimeout time.Duration
	busOpts         []bus.Option
	tracer          tracing.Tracer // WithTracerProvider (visibility.go); off by default
}

// WithID sets the worker id (default "worker-" and 8 random hex digits). The
// coordinator treats a registration under a live id as the same worker coming back.
func WithID(id string) Option { return func(c *config) { c.ID = id } }

// WithCapacity sets how many attempts the worker runs at once (default 4, 1..1024).
func WithCapacity(n int) Option { return func(c *config) { c.Capacity = n } }

// WithHeartbeat sets the heartbeat interval (default 2s). Keep it well below the
// coordinator's heartbeat timeout.
func WithHeartbeat(interval time.Duration) Option {
	return func(c *config) { c.Heartbeat = interval }
}

// WithTasks sets the task types the worker runs (default tasks.Builtins()). The worker
// advertises their names when it registers.
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

// WithLogger sets the logger of the worker and of its bus node (default slog.Default();
// nil discards).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.Logger = workercfg.Logger(l) }
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
		Common:          workercfg.New(DefaultCapacity, DefaultHeartbeat),
		retryBase:       DefaultRetryBase,
		retryMax:        DefaultRetryMax,
		shutdownTimeout: DefaultShutdownTimeout,
	}
	for _, o := range opts {
		o(&c)
	}
	c.Complete()
	return c, c.validate()
}

// retry is the backoff between offers of a result, and between registrations.
func (c *config) retry() backoff.Policy { return backoff.Policy{Base: c.retryBase, Max: c.retryMax} }

// validate returns every problem at once.
func (c *config) validate() error {
	errs := c.Common.Validate()
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
