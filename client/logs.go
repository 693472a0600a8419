package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// LogRecord is one record of a job's log: a JSON object as the worker's slog handler
// wrote it (time, level, msg, attempt and the handler's attributes), or a marker
// jobbus adds (Dropped) where older records were dropped to keep the job's last
// protocol.LogChunksPerJob chunks (at most 1 MiB: fewer records when its worker
// shipped them a few at a time).
type LogRecord struct {
	// Attempt is the attempt that wrote it.
	Attempt int
	// JSON is the record itself.
	JSON json.RawMessage
	// Dropped is set on a marker: Chunks chunks of this attempt's log, its oldest,
	// were dropped before this point.
	Dropped bool
	Chunks  int
}

// Fields are the record's common fields, read from its JSON; zero values where it
// has none.
func (r LogRecord) Fields() (at time.Time, level, msg string) {
	var f struct {
		Time  time.Time `json:"time"`
		Level string    `json:"level"`
		Msg   string    `json:"msg"`
	}
	_ = json.Unmarshal(r.JSON, &f)
	return f.Time, f.Level, f.Msg
}

// ErrNoLogs means the job logs stream does not exist: no coordinator kept logs there.
var ErrNoLogs = errors.New("no job logs are kept (stream " + protocol.LogsStream + " does not exist)")

// logPoll is how often a followed log is read again.
const logPoll = 200 * time.Millisecond

// logGrace is how long a follow goes on reading after the job ended, for the last
// chunk of an attempt whose handler had not returned: a job cancelled, or whose
// deadline passed, ends at once, and its handler may log while it stops. A worker
// that is gone, or older than the last-chunk mark, costs a follow this much at its end.
// The dashboard's job page waits as long (LOG_GRACE in its app.js).
const logGrace = 2 * time.Second

// Logs hands fn job id's log records in order, oldest first. Without follow it
// returns once it has handed what is stored; with follow it goes on handing new
// records as the job's worker writes them, and returns once the job has ended and
// every record it wrote was handed, or when ctx ends or fn fails. A worker stores an
// attempt's log before its result, and marks its last chunk when the handler returns
// (protocol.HeaderLogFinal): after the job ended, a follow waits for the last chunk of
// each attempt it read, at most logGrace, for what a cancelled or overrun handler logs
// as it stops. It needs a NATS client (New): the logs are in JetStream, stream
// protocol.LogsStream, subject protocol.LogSubject(id).
func (c *Client) Logs(ctx context.Context, id string, follow bool, fn func(LogRecord) error) error {
	n, ok := c.tr.(*natsTransport)
	if !ok {
		return fmt.Errorf("job logs are read over NATS, not the TCP client port")
	}
	job, err := c.Status(ctx, id)
	if err != nil {
		return err
	}
	js, err := jetstream.New(n.nc)
	if err != nil {
		return fmt.Errorf("job logs: %w", err)
	}
	stream, err := js.Stream(ctx, protocol.LogsStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return ErrNoLogs
	}
	if err != nil {
		return fmt.Errorf("job logs: %w", causeOf(ctx, err))
	}
	r := logReader{stream: stream, subject: protocol.LogSubject(id), next: 1, chunks: map[int]int{}, open: map[int]bool{}}
	var endedAt time.Time
	if job.State.Terminal() {
		endedAt = time.Now()
	}
	for {
		if err := r.drain(ctx, fn); err != nil {
			return err
		}
		if !follow || !endedAt.IsZero() && (len(r.open) == 0 || time.Since(endedAt) >= logGrace) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(logPoll):
		}
		if !endedAt.IsZero() {
			continue
		}
		// The end is read before the next drain: whatever the job stored before it
		// ended is read then.
		job, err := c.Status(ctx, id)
		if err != nil {
			return err
		}
		if job.State.Terminal() {
			endedAt = time.Now()
		}
	}
}

// logReader reads one job's log subject from sequence next on.
type logReader struct {
	stream  jetstream.Stream
	subject string
	next    uint64
	chunks  map[int]int  // attempt -> the next chunk number expected
	open    map[int]bool // attempts read without their last chunk (protocol.HeaderLogFinal)
}

// drain hands fn every record stored from r.next on.
func (r *logReader) drain(ctx context.Context, fn func(LogRecord) error) error {
	for {
		m, err := r.stream.GetMsg(ctx, r.next, jetstream.WithGetMsgSubject(r.subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("job logs: %w", causeOf(ctx, err))
		}
		r.next = m.Sequence + 1
		if err := r.chunk(m.Header, m.Data, fn); err != nil {
			return err
		}
	}
}

// chunk hands fn the records of one chunk, after a marker when older chunks of its
// attempt are gone.
func (r *logReader) chunk(h nats.Header, data []byte, fn func(LogRecord) error) error {
	attempt, _ := strconv.Atoi(h.Get(protocol.HeaderLogAttempt))
	n, _ := strconv.Atoi(h.Get(protocol.HeaderLogChunk))
	if want := r.chunks[attempt]; n > want {
		marker := fmt.Appendf(nil, `{"level":"WARN","msg":"jobbus: %d older log chunks of attempt %d dropped (a job keeps its last %d chunks, at most %d bytes)"}`, n-want, attempt, protocol.LogChunksPerJob, protocol.MaxLogBytesPerJob)
		if err := fn(LogRecord{Attempt: attempt, JSON: marker, Dropped: true, Chunks: n - want}); err != nil {
			return err
		}
	}
	r.chunks[attempt] = n + 1
	if h.Get(protocol.HeaderLogFinal) != "" {
		delete(r.open, attempt)
	} else {
		r.open[attempt] = true
	}
	for len(data) > 0 {
		line, rest, _ := bytes.Cut(data, []byte{'\n'})
		data = rest
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if err := fn(LogRecord{Attempt: attempt, JSON: json.RawMessage(bytes.Clone(line))}); err != nil {
			return err
		}
	}
	return nil
}
