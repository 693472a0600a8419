package worker

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/jobctx"
	"github.com/jobbus/jobbus/internal/tracing"
	"github.com/jobbus/jobbus/worker/internal/attempts"
)

// Seeing inside a job: what a native handler reports while it runs. Its context
// carries the job's trace (the attempt's span, a child of the submitter's trace), a
// progress reporter and a logger; a handler on a spec TCP worker gets none of them,
// and Progress and Logger then do nothing.

// Progress reports the running attempt's progress: fraction in 0..1 (clamped) and a
// short message (at most protocol.MaxProgressMessage bytes). Call it as often as
// suits the handler: the worker sends the latest at most every ProgressEvery, and
// the coordinator stores it in the job's record (its snapshot's progress and
// progressMessage) at most as often. Progress never changes the job's state.
func Progress(ctx context.Context, fraction float64, message string) {
	jobctx.Progress(ctx, fraction, message)
}

// Logger is the running attempt's logger: its records, JSON lines with their
// attributes (the job's structured output), are kept with the job, the last
// protocol.LogChunksPerJob chunks of them (a chunk is what the worker ships at once,
// at most every 200 ms: at most protocol.MaxLogBytesPerJob, and one record a chunk
// for a handler that logs a line at a time), and stream to `jobbus logs ID --follow` and the
// dashboard while the job runs. A handler that logs faster than the worker ships
// (LogBytesPerSecond) loses lines, with a marker saying how many; nothing else slows
// down. Without a running attempt in ctx it discards.
func Logger(ctx context.Context) *slog.Logger { return jobctx.Logger(ctx) }

// ProgressEvery is the least time between two progress reports of one attempt.
const ProgressEvery = 250 * time.Millisecond

// Shipping of an attempt's log: at most logBurst bytes every logFlushEvery (so
// LogBytesPerSecond), in chunks of at most protocol.LogChunkBytes.
const (
	logFlushEvery     = 200 * time.Millisecond
	logBurst          = 4 * protocol.LogChunkBytes
	LogBytesPerSecond = logBurst * int(time.Second/logFlushEvery)
	logPublishTimeout = 2 * time.Second
	finalProgressWait = 5 * time.Second
)

// WithTracerProvider has the worker trace each attempt with a "jobbus attempt" span
// (kind consumer) from tp, a child of the trace the job was submitted in: attempt
// number, worker id and outcome as attributes, so a retried job's attempts are
// siblings under one trace. Tracing is off by default; the handler's context carries
// the job's trace context either way.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracer = tracing.New(tp) }
}

// scope is one attempt's progress and log (a jobctx.Scope). Made per attempt, it
// costs nothing more until the handler reports or logs.
type scope struct {
	w *Worker
	m *protocol.TaskAssign

	mu       sync.Mutex
	done     bool
	sentAt   time.Time // the last progress report's
	pending  bool      // a report waits for its turn
	fraction float64
	message  string
	timer    *time.Timer

	logOnce sync.Once
	logger  *slog.Logger
	log     *logShipper // nil until the first record
}

// newRun begins attempt m: its span and scope, in the context its handler gets (run).
func (w *Worker) newRun(m *protocol.TaskAssign) *run {
	r := &run{w: w, m: *m}
	ctx := tracing.ContextWith(context.Background(), m.TraceParent, m.TraceState)
	if w.cfg.tracer.Samples(trace.SpanContextFromContext(ctx)) {
		var span trace.Span
		ctx, span = w.cfg.tracer.Start(ctx, "jobbus attempt", trace.WithSpanKind(trace.SpanKindConsumer))
		if span.IsRecording() { // attributes only for a sampled span
			// Only what the trace does not say already: the job's id and task type
			// are on the submission's spans, its parents.
			span.SetAttributes(tracing.System, tracing.AttrAttempt.Int(m.AttemptNumber), tracing.AttrWorker.String(w.cfg.ID))
			r.span = span
		} // else nothing to end
	}
	r.Context = ctx
	r.scope = scope{w: w, m: &r.m}
	return r
}

// endSpan ends an attempt's span with its outcome. The task's error is taken as it
// was read while the attempt ran (o.Text, o.Permanent), not read again: an error may
// panic when read once its attempt ended, and here no recover would catch it.
func endSpan(span trace.Span, o attempts.Outcome) {
	if span == nil {
		return
	}
	outcome := "success"
	switch {
	case o.Err == nil:
	case o.StoppedBy(attempts.ErrCancelled):
		outcome = "cancelled"
	case o.StoppedBy(errShutdown), o.StoppedBy(errAbandoned):
		outcome = "abandoned"
	case o.Permanent():
		outcome = "permanent_failure"
	default:
		outcome = "failure"
	}
	span.SetAttributes(tracing.AttrOutcome.String(outcome))
	if o.Err != nil {
		text := o.Text()
		// span.RecordError's event, from what was read: RecordError reads the error.
		span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(
			semconv.ExceptionType(typeName(o.Err)), semconv.ExceptionMessage(text)))
		span.SetStatus(codes.Error, text)
	}
	span.End()
}

// typeName is err's type as span.RecordError names it, without calling its methods.
func typeName(err error) string {
	t := reflect.TypeOf(err)
	if t.PkgPath() == "" && t.Name() == "" { // a pointer, a slice...
		return t.String()
	}
	return t.PkgPath() + "." + t.Name()
}

// Progress is jobctx.Scope's: it keeps the latest report and sends it at most every
// ProgressEvery.
func (s *scope) Progress(fraction float64, message string) {
	fraction = protocol.ClampProgress(fraction)
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return
	}
	s.fraction, s.message, s.pending = fraction, message, true
	if s.timer != nil { // a send is due already: it takes the latest
		s.mu.Unlock()
		return
	}
	if wait := ProgressEvery - time.Since(s.sentAt); wait > 0 {
		s.timer = time.AfterFunc(wait, s.sendDue)
		s.mu.Unlock()
		return
	}
	r := s.takeLocked()
	s.mu.Unlock()
	s.send(r)
}

// sendDue sends the report that waited for its turn.
func (s *scope) sendDue() {
	s.mu.Lock()
	s.timer = nil
	if s.done || !s.pending {
		s.mu.Unlock()
		return
	}
	r := s.takeLocked()
	s.mu.Unlock()
	s.send(r)
}

// takeLocked takes the pending report. Called with s.mu held.
func (s *scope) takeLocked() *protocol.TaskProgress {
	s.pending = false
	s.sentAt = time.Now()
	return s.report()
}

// report is the latest report. Called with s.mu held.
func (s *scope) report() *protocol.TaskProgress {
	return &protocol.TaskProgress{WorkerID: s.w.cfg.ID, JobID: s.m.JobID, AttemptID: s.m.AttemptID,
		Progress: s.fraction, Message: protocol.ClipProgressMessage(s.message)}
}

func (s *scope) send(r *protocol.TaskProgress) {
	// A tell: a lost report is superseded by the next, and the result supersedes all.
	if err := s.w.node.Tell(s.w.sendCtx, coordinator, protocol.PathProgress, r); err != nil && s.w.debug() {
		s.w.attemptLog(s.m).Debug("progress not sent", "err", err)
	}
}

// Logger is jobctx.Scope's: a JSON logger into the attempt's log shipper, made on
// first use. Once the attempt has ended (a context kept beyond its handler) it
// discards: end has shipped the log already, and a shipper made now would never stop.
func (s *scope) Logger() *slog.Logger {
	s.logOnce.Do(func() {
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			s.logger = slog.New(slog.DiscardHandler)
			return
		}
		s.log = newLogShipper(s.w, s.m)
		s.mu.Unlock()
		h := slog.NewJSONHandler(s.log, &slog.HandlerOptions{Level: slog.LevelDebug})
		s.logger = slog.New(h).With("attempt", s.m.AttemptNumber)
	})
	return s.logger
}

// end finishes the attempt's reporting before its result goes: the last pending
// progress is sent and the log shipped (within logPublishTimeout).
func (s *scope) end() {
	s.mu.Lock()
	s.done = true
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	var r *protocol.TaskProgress
	switch {
	case s.pending:
		r = s.takeLocked()
	case !s.sentAt.IsZero():
		// The last report went as a tell, which the result may overtake: asked
		// again, it is taken first (the same values cost the record no write).
		r = s.report()
	}
	ls := s.log
	s.mu.Unlock()
	if r != nil {
		// Asked, not told: the coordinator takes it before the result, which would
		// make it stale; the last report of an attempt is the one a user sees.
		ctx, cancel := context.WithTimeout(s.w.sendCtx, finalProgressWait)
		if _, err := bus.Ask[struct{}](ctx, s.w.node, coordinator, protocol.PathProgress, r); err != nil && s.w.debug() {
			s.w.attemptLog(s.m).Debug("last progress not taken", "err", err)
		}
		cancel()
	}
	if ls != nil {
		ls.close()
	}
}

// logShipper is an attempt's log on its way to the job's log subject: records are
// buffered (at most logBurst bytes; more are dropped and counted) and a goroutine of
// its own publishes them to JetStream every logFlushEvery, until close.
type logShipper struct {
	w       *Worker
	subject string
	attempt string

	mu      sync.Mutex
	buf     bytes.Buffer
	dropped int // records dropped since the last flush
	closed  bool
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	chunk   int // the next chunk's number
}

func newLogShipper(w *Worker, m *protocol.TaskAssign) *logShipper {
	l := &logShipper{w: w, subject: protocol.LogSubject(m.JobID), attempt: strconv.Itoa(m.AttemptNumber),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

// Write takes one record (slog's handlers write each in one call).
func (l *logShipper) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) > protocol.LogChunkBytes {
		p = fmt.Appendf(nil, `{"level":"WARN","msg":"jobbus: a log record of %d bytes was dropped (at most %d)"}`+"\n", len(p), protocol.LogChunkBytes)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
	case l.buf.Len()+len(p) > logBurst:
		l.dropped++
	default:
		l.buf.Write(p)
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	return n, nil
}

func (l *logShipper) run() {
	defer close(l.done)
	for {
		select {
		case <-l.wake:
		case <-l.stop:
			l.flush(true)
			return
		}
		l.flush(false)
		select { // at most one flush every logFlushEvery: a flood costs only its own lines
		case <-time.After(logFlushEvery):
		case <-l.stop:
			l.flush(true)
			return
		}
	}
}

// flush publishes what is buffered, in chunks that end at a record's end. The final
// flush, once the handler returned, marks its last chunk (an empty one when nothing
// is left) protocol.HeaderLogFinal: a follower of a job that ended before its handler
// returned waits for it.
func (l *logShipper) flush(final bool) {
	l.mu.Lock()
	data := bytes.Clone(l.buf.Bytes())
	l.buf.Reset()
	if l.dropped > 0 {
		data = append(data, fmt.Appendf(nil, `{"level":"WARN","msg":"jobbus: %d log records dropped: the job logged faster than %d bytes/s"}`+"\n", l.dropped, LogBytesPerSecond)...)
		l.dropped = 0
	}
	l.mu.Unlock()
	js, err := l.w.jetStream()
	if err != nil {
		return
	}
	for len(data) > 0 || final {
		cut := len(data)
		if cut > protocol.LogChunkBytes {
			cut = bytes.LastIndexByte(data[:protocol.LogChunkBytes], '\n') + 1
			if cut <= 0 {
				cut = protocol.LogChunkBytes
			}
		}
		msg := &nats.Msg{Subject: l.subject, Data: data[:cut], Header: nats.Header{}}
		msg.Header.Set(protocol.HeaderLogAttempt, l.attempt)
		msg.Header.Set(protocol.HeaderLogChunk, strconv.Itoa(l.chunk))
		l.chunk++
		data = data[cut:]
		if final && len(data) == 0 {
			msg.Header.Set(protocol.HeaderLogFinal, "1")
			final = false
		}
		ctx, cancel := context.WithTimeout(l.w.sendCtx, logPublishTimeout)
		_, err := js.PublishMsg(ctx, msg)
		cancel()
		if err != nil {
			if l.w.debug() {
				l.w.log.Debug("job log not stored", "subject", l.subject, "err", err)
			}
			return // what is left of this flush is lost; the job runs on
		}
	}
}

// close ships what is left and stops the goroutine.
func (l *logShipper) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.mu.Unlock()
	close(l.stop)
	<-l.done
}

// jetStream is the worker's JetStream context, made once.
func (w *Worker) jetStream() (jetstream.JetStream, error) {
	w.jsOnce.Do(func() { w.js, w.jsErr = jetstream.New(w.node.Conn()) })
	return w.js, w.jsErr
}
