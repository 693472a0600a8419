package coordinator

import (
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"log/slog"
	"time"

	"github.com/jobbus/jobbus/bus/protocol/tasktype"
)

// Config is every knob of a coordinator, with the reference implementation's defaults
// (see DefaultConfig). The CLI only maps flags onto it.
type Config struct {
	// HeartbeatTimeout is how long a worker may stay silent before it is lost.
	HeartbeatTimeout time.Duration
	// SweepInterval is how often deadlines, due retries and silent workers are checked.
	SweepInterval time.Duration
	// TaskTimeout is the execution deadline of one attempt.
	TaskTimeout time.Duration
	// MaxAttempts is used when a submission asks for maxAttempts <= 0.
	MaxAttempts int
	// RetryBaseDelay and RetryMaxDelay shape RETRY_WAIT: min(max, base * 2^(attempts-1)).
	RetryBaseDelay time.Duration
	RetryMaxDelay  time.Duration
	// MaxActiveJobs bounds QUEUED + RETRY_WAIT + RUNNING; new submissions beyond it are rejected.
	MaxActiveJobs int
	// MaxScheduledJobs bounds the SCHEDULED jobs (delayed, snoozed), apart from
	// MaxActiveJobs, which does not count them; 0 means 1,000,000. A job that comes due
	// queues whatever the active count (delayed.go).
	MaxScheduledJobs int
	// ScheduleWindow: a SCHEDULED job due within it is held whole in memory with its
	// timer; one due later only by its index entry and due time, its record read back
	// once it comes within it. 0 means one minute.
	ScheduleWindow time.Duration
	// AgingStep raises a queued job's effective priority by one level per whole step waited.
	AgingStep time.Duration
	// Retention is how long a finished job (COMPLETED, FAILED, CANCELLED), and its
	// idempotency key, are kept after it ended; 0 keeps them forever. Active jobs never
	// expire. JetStream removes them itself (a per-message TTL on the finishing write).
	Retention time.Duration
	// JobLogBytes bounds the stream of job logs as a whole (joblogs.go): 0 means
	// DefaultJobLogBytes, a negative value keeps no job logs.
	JobLogBytes int64
	// StoreLimit is the JetStream server's cap on its file storage (serve's
	// --nats-max-store, or the default it took), 0 when unknown. JetStream refuses
	// every file write at its cap, the leader lease's renewal too; so, given it, the
	// jobs bucket is limited below it (jobsMaxBytes, jswrite.go): submissions are then
	// refused by that limit while the lease can still be renewed. 0 keeps the bucket's
	// limit as it is.
	StoreLimit int64
	// TracerProvider traces submissions, queueing, attempts' assignment and results
	// (trace.go); nil (the default) is tracing off. A job's trace context is stored
	// and handed to its workers either way.
	TracerProvider trace.TracerProvider
	// Replicas of the KV buckets a coordinator creates: 0 means 3 in a cluster (or the
	// cluster's size, if smaller) and 1 on a lone server, and keeps an existing bucket's
	// count. A count that differs from an existing bucket's is refused
	// (ErrReplicasDiffer) unless ReconfigureBuckets (buckets.go).
	Replicas int
	// ReconfigureBuckets lets Replicas change the replica count of existing buckets,
	// and LeaderLease the lease bucket's TTL.
	ReconfigureBuckets bool
	// SyncAlways says the server syncs every write to disk (a server configured with
	// sync_interval: always): writes then go as atomic batches, so that one sync covers
	// many (group commit), as they do with Replicas > 1.
	SyncAlways bool
	// SyncJobs, when set, makes every job write JetStream has acknowledged durable
	// (embeddednats.StreamSync on the jobs stream: serve --sync always). A write is
	// recorded, and answered for, only after a SyncJobs call that began after its
	// acknowledgement; writes acknowledged during one call share the next (group
	// commit, durable.go). Its server must not sync each write itself.
	SyncJobs func() error
	// Writers is how many writes may be in flight at once on a single server that
	// does not sync each write (pipeline.go), SyncJobs or not. When writes are
	// batched (a cluster, SyncAlways), one batch is: it carries every change that
	// waited for the one before (group commit).
	Writers int
	// ID names this coordinator in the leader lease. A coordinator that finds the lease
	// held under its own ID (it crashed, and restarted before the lease ran out) takes
	// it back at once instead of waiting the lease out. So it must be unique to one
	// process at a time: serve keeps one in its store directory, which it locks; empty
	// means a random one per process, which waits out a lease it left behind.
	ID string
	// LeaderLease is how long a leader's lease lasts unless renewed (every third of it):
	// a standby takes over within about this long of the leader's loss. It is the lease
	// bucket's TTL, so every coordinator must use the same: another is refused
	// (ErrLeaseDiffers) unless ReconfigureBuckets (buckets.go).
	LeaderLease time.Duration
	// ReplyWithin is how long after its arrival a submission or a cancel is answered at
	// the latest when the request does not say how long its sender waits
	// (protocol.HeaderTimeout): a write neither confirmed nor ruled out by then is
	// answered "Outcome unknown" (protocol.OutcomeUnknown) and goes on. Clients wait
	// 5 s by default.
	ReplyWithin time.Duration
	// ClaimGrace is how long a coordinator that has just recovered (a restart, a
	// takeover) waits for workers to claim the attempts the store shows running, which
	// they do by reporting them as they register again; an attempt nobody claims
	// within it is lost. 0 means HeartbeatTimeout plus the time a NATS connection takes
	// to come back (about 3 s).
	ClaimGrace time.Duration

	// fullRecovery makes recovery ignore the checkpoint: Run sets it after a fence,
	// when the last memory was not the truth.
	fullRecovery bool

	// TaskTypes validates payloads; nil means the five built-in task types.
	TaskTypes *tasktype.Set
	// Now is the clock; nil means time.Now. Tests inject one to age jobs without waiting.
	Now func() time.Time
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Observer sees submissions, state changes and writes, for metrics; nil: none.
	Observer Observer
	// StoreFault, if set, reports a failure of the disk under JetStream that its server
	// knows of (serve's embedded server: a full disk, a read-only file system), nil
	// while the store takes writes. While it reports one, submissions are refused at
	// once with an ERROR that names it; accepted jobs wait for the store (storage.go).
	StoreFault func() error
}

// defaultTaskTimeout is the longest SLEEP PROTOCOL.md allows (10 minutes) and a minute
// more, for its assignment and its result to travel: the reference's 10 minutes, the
// longest SLEEP itself, had passed by the time such a SLEEP's result arrived, and the
// job completed only if no sweep ran in between. A minute is as long as the bridge
// offers a TCP worker's result (bridge.Config.ResultRetryFor) while no coordinator
// serves.
const defaultTaskTimeout = time.Duration(tasktype.MaxSleepMillis)*time.Millisecond + time.Minute

// DefaultConfig returns the defaults of DESIGN.md, but for TaskTimeout (11 minutes, not
// the reference's 10: defaultTaskTimeout).
func DefaultConfig() Config {
	return Config{
		HeartbeatTimeout: 6 * time.Second,
		SweepInterval:    500 * time.Millisecond,
		TaskTimeout:      defaultTaskTimeout,
		MaxAttempts:      3,
		RetryBaseDelay:   time.Second,
		RetryMaxDelay:    30 * time.Second,
		MaxActiveJobs:    10000,
		MaxScheduledJobs: 1_000_000,
		ScheduleWindow:   time.Minute,
		AgingStep:        time.Minute,
		Retention:        24 * time.Hour,
		Replicas:         0,
		Writers:          256,
		LeaderLease:      2 * time.Second,
		ReplyWithin:      4 * time.Second,
	}
}

// Validate returns every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	positive := func(name string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", name, d))
		}
	}
	positive("heartbeat timeout", c.HeartbeatTimeout)
	positive("sweep interval", c.SweepInterval)
	positive("task timeout", c.TaskTimeout)
	positive("retry base delay", c.RetryBaseDelay)
	positive("aging step", c.AgingStep)
	if c.LeaderLease < 300*time.Millisecond {
		errs = append(errs, fmt.Errorf("leader lease must be at least 300ms, got %v", c.LeaderLease))
	}
	if c.Retention != 0 && c.Retention < time.Second {
		errs = append(errs, fmt.Errorf("retention must be 0 (keep forever) or at least 1s (JetStream's smallest TTL), got %v", c.Retention))
	}
	if c.RetryMaxDelay < c.RetryBaseDelay {
		errs = append(errs, fmt.Errorf("retry max delay (%v) must be at least the base delay (%v)", c.RetryMaxDelay, c.RetryBaseDelay))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("max attempts must be at least 1, got %d", c.MaxAttempts))
	}
	if c.MaxActiveJobs < 1 {
		errs = append(errs, fmt.Errorf("max active jobs must be at least 1, got %d", c.MaxActiveJobs))
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas must be 0 (3 in a cluster, else 1) or in 1..5, got %d", c.Replicas))
	}
	if c.ReplyWithin < 0 {
		errs = append(errs, fmt.Errorf("reply within must not be negative, got %v", c.ReplyWithin))
	}
	if c.ClaimGrace < 0 {
		errs = append(errs, fmt.Errorf("claim grace must be 0 (the default) or positive, got %v", c.ClaimGrace))
	}
	if c.MaxScheduledJobs < 0 {
		errs = append(errs, fmt.Errorf("max scheduled jobs must be 0 (the default) or positive, got %d", c.MaxScheduledJobs))
	}
	if c.ScheduleWindow < 0 {
		errs = append(errs, fmt.Errorf("schedule window must be 0 (the default) or positive, got %v", c.ScheduleWindow))
	}
	if c.Writers < 1 {
		errs = append(errs, fmt.Errorf("writers must be at least 1, got %d", c.Writers))
	}
	return errors.Join(errs...)
}

func (c *Config) fill() {
	if c.TaskTypes == nil {
		c.TaskTypes = tasktype.Builtins()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.ReplyWithin == 0 {
		c.ReplyWithin = DefaultConfig().ReplyWithin
	}
	if c.MaxScheduledJobs == 0 {
		c.MaxScheduledJobs = DefaultConfig().MaxScheduledJobs
	}
	if c.ScheduleWindow == 0 {
		c.ScheduleWindow = DefaultConfig().ScheduleWindow
	}
}

// retryDelay is min(max, base * 2^(attempts-1)), without overflow.
func (c Config) retryDelay(attempts int) time.Duration {
	d := c.RetryBaseDelay
	for i := 1; i < attempts && d < c.RetryMaxDelay; i++ {
		d *= 2
	}
	return min(d, c.RetryMaxDelay)
}
