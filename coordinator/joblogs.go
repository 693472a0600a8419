package coordinator

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Job logs (protocol.LogsStream) are written by workers straight to JetStream, never
// through the coordinator: a job that floods its log costs its own worker's shipping
// budget and its own subject's room, and no coordinator time. The coordinator only
// makes the stream, with the bounds that make it safe:
//
//   - per job: the last protocol.LogChunksPerJob chunks of protocol.LogChunkBytes
//     (MaxMsgsPerSubject, oldest first; MaxMsgSize refuses a bigger chunk), so at
//     most 1 MiB (a chunk is a worker's flush: a job that logs a line at a time keeps
//     that many lines);
//   - as a whole: Config.JobLogBytes (MaxBytes, the oldest chunks of any job first),
//     at most a quarter of the store's cap (Config.StoreLimit: logsMaxBytes), or less
//     in a store without room for it (makeLogs);
//   - in time: MaxAge = Retention + logAgeMargin(cfg). A chunk is written while its
//     job runs, so it outlives the job's record by at most the margin (and readers ask
//     for the job first: an expired job has no log); and it lasts as long as the record
//     for a job whose attempts all fit the margin (by default every attempt's deadline
//     and retry wait: about half an hour). Retention 0 (keep forever) keeps logs until
//     MaxBytes pushes them out.
//
// One replica: a log is a diagnostic, not state, and losing it with its server costs
// no job anything.

// logAgeMargin is how much longer than the retention a log chunk is kept: at least
// an hour, and the longest a job runs with the default timeouts (every attempt's
// deadline and the retry waits between them).
func logAgeMargin(cfg *Config) time.Duration {
	return max(time.Hour, time.Duration(cfg.MaxAttempts)*(cfg.TaskTimeout+cfg.RetryMaxDelay))
}

// DefaultJobLogBytes bounds the logs stream as a whole.
const DefaultJobLogBytes = 1 << 30

// logsMaxBytes is the job logs stream's limit for cfg: Config.JobLogBytes (0: the
// default), at most a quarter of the store's cap when it is known, so that the jobs
// bucket's limit (jobsMaxBytes) has the rest; 0 when logs are off.
func logsMaxBytes(cfg *Config) int64 {
	if cfg.JobLogBytes < 0 {
		return 0
	}
	limit := cfg.JobLogBytes
	if limit == 0 {
		limit = DefaultJobLogBytes
	}
	if share := cfg.StoreLimit / 4; share > 0 && share < limit {
		limit = share
	}
	return limit
}

// logStreamConfig is the stream of job logs for cfg.
func logStreamConfig(cfg *Config) jetstream.StreamConfig {
	var age time.Duration
	if cfg.Retention > 0 {
		age = cfg.Retention + logAgeMargin(cfg)
	}
	limit := logsMaxBytes(cfg)
	return jetstream.StreamConfig{
		Name:              protocol.LogsStream,
		Description:       fmt.Sprintf("jobbus job logs: one subject per job, its last %d chunks (at most %d KiB each)", protocol.LogChunksPerJob, protocol.LogChunkBytes>>10),
		Subjects:          []string{protocol.LogSubjectPrefix + "*"},
		MaxMsgsPerSubject: protocol.LogChunksPerJob,
		MaxMsgSize:        protocol.LogChunkBytes + 1024, // the chunk and its headers
		MaxBytes:          limit,
		MaxAge:            age,
		Discard:           jetstream.DiscardOld,
		Storage:           jetstream.FileStorage,
		Replicas:          1,
	}
}

// openLogs makes (or updates) the job logs stream. A failure is logged, not fatal:
// jobs run without their logs kept.
func openLogs(ctx context.Context, nc *nats.Conn, cfg *Config) {
	if cfg.JobLogBytes < 0 {
		return // job logs off
	}
	js, err := jetstream.New(nc)
	if err == nil {
		err = makeLogs(ctx, js, logStreamConfig(cfg), cfg)
	}
	if err != nil {
		cfg.Logger.Warn("job logs are not kept: cannot make their stream", "stream", protocol.LogsStream, "err", fmt.Errorf("%w", err))
	}
}

// makeLogs makes the logs stream sc. JetStream reserves a stream's MaxBytes in its
// store when it makes it, and refuses a stream bigger than the room left (a small
// --nats-max-store or disk): then the logs take a quarter of the most that fits (found
// by halving), so that chatty jobs cannot fill the store the jobs themselves need.
func makeLogs(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig, cfg *Config) error {
	want := sc.MaxBytes
	_, err := js.CreateOrUpdateStream(ctx, sc)
	for StoreFull(err) && sc.MaxBytes/8 >= protocol.MaxLogBytesPerJob {
		sc.MaxBytes /= 2
		_, err = js.CreateOrUpdateStream(ctx, sc)
	}
	if err != nil {
		return err
	}
	if sc.MaxBytes == want {
		if full := cmp.Or(cfg.JobLogBytes, DefaultJobLogBytes); want < full {
			cfg.Logger.Info("job logs capped below their default: a quarter of the store's cap", "stream", protocol.LogsStream, "max_bytes", want, "store_limit", cfg.StoreLimit)
		}
		return nil
	}
	sc.MaxBytes /= 4
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		return err
	}
	cfg.Logger.Info("job logs capped below their default: the store has no room for it", "stream", protocol.LogsStream, "max_bytes", sc.MaxBytes, "default", want)
	return nil
}
