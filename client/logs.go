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

// Logs hands fn job id's log records in order, oldest first. Without follow it
// returns once it has handed what is stored; with follow it goes on handing new
// records as the job's worker writes them, and returns once the job has ended and
// every record it wrote was handed (a worker stores an attempt's log before its
// result), or when ctx ends or fn fails. It needs a NATS client (New): the logs are
// in JetStream, stream protocol.LogsStream, subject protocol.LogSubject(id).
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
	r := logReader{stream: stream, subject: protocol.LogSubject(id), next: 1, chunks: map[int]int{}}
	ended := !follow || job.State.Terminal()
	for {
		if err := r.drain(ctx, fn); err != nil {
			return err
		}
		if ended {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(logPoll):
		}
		// Ended is read before the last drain: whatever it stored before it ended
		// is read then.
		job, err := c.Status(ctx, id)
		if err != nil {
			return err
		}
		ended = job.State.Terminal()
	}
}

// logReader reads one job's log subject from sequence next on.
type logReader struct {
	stream  jetstream.Stream
	subject string
	next    uint64
	chunks  map[int]int // attempt -> the next chunk number expected
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
