// Package client is the Go client of jobbus for native users: submit, status, list,
// cancel, wait and watch, over NATS, speaking the client-port JSON of PROTOCOL.md to the
// coordinator's `jobbus` micro service.
//
//	c := client.New(nc)
//	id, err := c.Submit(ctx, "SHA256", map[string]any{"text": "hello"})
//	job, err := c.Wait(ctx, id)
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/backoff"
	"github.com/jobbus/jobbus/internal/natsurl"
	"github.com/jobbus/jobbus/internal/tracing"
)

// Errors callers test with errors.Is.
var (
	// ErrNoCoordinator means no coordinator answered: jobbus is not running there.
	ErrNoCoordinator = errors.New("no jobbus coordinator answered")
	// ErrRejected means the coordinator refused a submission for overload; retry later.
	ErrRejected = errors.New("submission rejected: coordinator at capacity")
	// ErrServer wraps an ERROR reply: the request was wrong, do not resend it as is.
	ErrServer = errors.New("coordinator error")
	// ErrOutcomeUnknown means the coordinator could not tell within the request's time
	// whether the request took effect: a submission's job may exist, and then it runs.
	// Do not resubmit it as a new job; ask for the status of the job OutcomeJob names,
	// or resubmit with the same idempotency key. An ERROR reply that says so is
	// ErrServer too, as is a submission, a cancel, a workflow's submission, cancel or
	// retry, or a schedule's, queue's or limit's command (its text says whether sending
	// it again is safe: a schedule's trigger sent again submits another job), whose
	// context ended (wrapping context.Canceled if it was cancelled) or whose NATS
	// connection closed after it was sent; over DialTCP, a request whose
	// connection broke (or whose client closed) after it was sent matches it as well,
	// naming no job.
	ErrOutcomeUnknown = errors.New("outcome unknown")
)

// RejectedError carries a SUBMIT_REJECTED; errors.Is(err, ErrRejected) holds.
type RejectedError struct{ protocol.SubmitRejected }

func (e *RejectedError) Error() string { return e.Reason }
func (e *RejectedError) Is(target error) bool {
	return target == ErrRejected
}

// ServerError carries an ERROR reply; errors.Is(err, ErrServer) holds.
type ServerError struct{ Message string }

func (e *ServerError) Error() string { return e.Message }

// Is matches ErrServer, ErrNoCoordinator for the bridge's "coordinator unavailable"
// answer, and ErrOutcomeUnknown for an "Outcome unknown" answer.
func (e *ServerError) Is(target error) bool {
	switch target {
	case ErrServer:
		return true
	case ErrNoCoordinator:
		return strings.HasPrefix(e.Message, protocol.UnavailablePrefix)
	case ErrOutcomeUnknown:
		return strings.HasPrefix(e.Message, protocol.OutcomeUnknownPrefix)
	}
	return false
}

// OutcomeJob returns the job an ErrOutcomeUnknown error is about, whose status tells
// what became of the request.
func OutcomeJob(err error) (jobID string, ok bool) {
	var se *ServerError
	if !errors.As(err, &se) {
		return "", false
	}
	return protocol.OutcomeUnknownJob(se.Message)
}

// OutcomeWorkflow returns the workflow (or batch) an ErrOutcomeUnknown error of a
// workflow's submission is about, whose status tells whether it was stored; so for a
// workflow's cancel or retry cut off by its NATS connection.
func OutcomeWorkflow(err error) (workflowID string, ok bool) {
	var se *ServerError
	if !errors.As(err, &se) {
		return "", false
	}
	rest, found := strings.CutPrefix(se.Message, protocol.OutcomeUnknownPrefix)
	rest = strings.TrimPrefix(rest, "retry of ") // the coordinator's answer to a retry
	for _, kind := range []string{protocol.KindWorkflow, protocol.KindBatch} {
		if rest, ok := strings.CutPrefix(rest, kind+" "); found && ok {
			id, _, _ := strings.Cut(rest, " ")
			return id, id != ""
		}
	}
	return "", false
}

// Transport carries one client-port request body of type t and returns the reply body.
// NATS (New) and the bridge's TCP client port (DialTCP) implement it.
type Transport interface {
	RoundTrip(ctx context.Context, t protocol.Type, body []byte) ([]byte, error)
	Close() error
}

// Client talks to a jobbus coordinator.
type Client struct {
	tr      Transport
	timeout time.Duration
	retry   submitRetry      // WithSubmitRetries; off by default
	notice  func(msg string) // WithFailoverNotice
	tracer  tracing.Tracer   // WithTracerProvider; off by default
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout bounds each request when its context has no deadline (default 5s, over
// DialTCP 6s; 0 or less keeps the default, as an unset option would).
func WithTimeout(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// New returns a client on nc, which it does not own.
func New(nc *nats.Conn, opts ...Option) *Client {
	c := NewWithTransport(nil, opts...)
	n := &natsTransport{nc: nc, notice: c.notice}
	n.nobodyFn = n.nobody
	c.tr = n
	return c
}

// NewWithTransport returns a client on any transport.
func NewWithTransport(tr Transport, opts ...Option) *Client {
	c := &Client{tr: tr, timeout: 5 * time.Second}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Close closes the transport (a NATS connection passed to New stays open).
func (c *Client) Close() error { return c.tr.Close() }

// Do sends one client-port request and returns the coordinator's reply message as is.
func (c *Client) Do(ctx context.Context, req protocol.Message) (protocol.Message, error) {
	data, err := protocol.Encode(req)
	if err != nil {
		return nil, err
	}
	reply, err := c.DoRaw(ctx, req.MessageType(), data)
	if err != nil {
		return nil, err
	}
	return protocol.Decode(reply)
}

// DoRaw sends a request body of type t and returns the raw reply body.
func (c *Client) DoRaw(ctx context.Context, t protocol.Type, body []byte) ([]byte, error) {
	if _, has := ctx.Deadline(); !has {
		if n, ok := c.tr.(*natsTransport); ok { // bounds it without a context of its own
			return n.roundTrip(ctx, t, body, c.timeout)
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	return c.tr.RoundTrip(ctx, t, body)
}

// natsTransport sends requests to the coordinator's micro service.
type natsTransport struct {
	nc       *nats.Conn
	notice   func(msg string)                // WithFailoverNotice
	nobodyFn func(ctx context.Context) error // nobody, made once
}

func (n *natsTransport) RoundTrip(ctx context.Context, t protocol.Type, body []byte) ([]byte, error) {
	return n.roundTrip(ctx, t, body, 0)
}

// roundTrip is RoundTrip within d when ctx has no deadline (0: none).
func (n *natsTransport) roundTrip(ctx context.Context, t protocol.Type, body []byte, d time.Duration) ([]byte, error) {
	subject, ok := protocol.SubjectFor(t)
	if !ok {
		return nil, fmt.Errorf("%s is not a client request", t)
	}
	msg, err := n.request(ctx, t, subject, body, d) // failover.go
	switch {
	case errors.Is(err, ErrNoCoordinator):
		return nil, err
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("%w on %s (is `jobbus serve` running?)", ErrNoCoordinator, natsurl.Connected(n.nc))
	case err != nil && ctx.Err() != nil && context.Cause(ctx) != ctx.Err():
		// Whoever ended the wait said why (the CLI: NATS refused the publish).
		return nil, fmt.Errorf("%s: %w", t, context.Cause(ctx))
	case err != nil:
		return nil, fmt.Errorf("%s: %w", t, err)
	}
	return msg.Data, nil
}

func (*natsTransport) Close() error { return nil }

// causeOf is err, or, when err is only ctx's end and whoever ended ctx said why (the
// CLI: NATS refused a publish), that reason.
func causeOf(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && context.Cause(ctx) != ctx.Err() {
		return context.Cause(ctx)
	}
	return err
}

// SubmitOption sets an optional field of a submission.
type SubmitOption func(*protocol.SubmitJob)

// MaxAttempts sets maxAttempts (<= 0: the server default).
func MaxAttempts(n int) SubmitOption { return func(s *protocol.SubmitJob) { s.MaxAttempts = n } }

// IdempotencyKey makes the submission idempotent under key.
func IdempotencyKey(key string) SubmitOption {
	return func(s *protocol.SubmitJob) { s.IdempotencyKey = &key }
}

// Priority sets the job's base priority.
func Priority(p protocol.Priority) SubmitOption {
	return func(s *protocol.SubmitJob) { s.Priority = &p }
}

// Submit submits a job and returns its id once it is durable. payload is JSON-encoded
// unless it is already json.RawMessage.
func (c *Client) Submit(ctx context.Context, taskType string, payload any, opts ...SubmitOption) (id string, err error) {
	if c.tracer.On() {
		var end func(string, error)
		ctx, end = c.submitSpan(ctx, taskType) // trace.go
		defer func() { end(id, err) }()
	}
	req, err := submission(taskType, payload, opts)
	if err != nil {
		return "", err
	}
	m, err := c.submit(ctx, req)
	if err != nil {
		return "", err
	}
	return submitted(m)
}

// submitted reads a submission's answer: its job's id, or the error it means.
func submitted(m protocol.Message) (id string, err error) {
	switch r := m.(type) {
	case *protocol.JobSubmitted:
		return r.JobID, nil
	case *protocol.SubmitRejected:
		return "", &RejectedError{*r}
	}
	return "", unexpected(m)
}

// submission is the SUBMIT_JOB of a submission of taskType with payload (JSON-encoded
// unless it is already json.RawMessage) and opts.
func submission(taskType string, payload any, opts []SubmitOption) (*protocol.SubmitJob, error) {
	raw, ok := payload.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(payload); err != nil {
			return nil, fmt.Errorf("encode payload: %w", err)
		}
	}
	req := &protocol.SubmitJob{TaskType: taskType, Payload: raw}
	for _, o := range opts {
		o(req)
	}
	return req, nil
}

// Status returns a job's snapshot.
func (c *Client) Status(ctx context.Context, id string) (protocol.Job, error) {
	r, err := answer[protocol.JobStatus](ctx, c, &protocol.GetJobStatus{JobID: id})
	if err != nil {
		return protocol.Job{}, err
	}
	return r.Job, nil
}

// List returns jobs newest first; the cursor, if not empty, fetches the next page.
func (c *Client) List(ctx context.Context, req protocol.ListJobs) (protocol.JobList, error) {
	r, err := answer[protocol.JobList](ctx, c, &req)
	if err != nil {
		return protocol.JobList{}, err
	}
	return *r, nil
}

// Workers returns the live workers sorted by id.
func (c *Client) Workers(ctx context.Context) ([]protocol.Worker, error) {
	r, err := answer[protocol.WorkerList](ctx, c, &protocol.ListWorkers{})
	if err != nil {
		return nil, err
	}
	return r.Workers, nil
}

// Cancel cancels a job; cancelled is true only if this call moved it to CANCELLED. An
// error matching ErrOutcomeUnknown (the coordinator could not tell in time, or, over
// NATS, the context ended or the connection went before its answer came) names the
// job (OutcomeJob): the cancel may or may not have been applied, and sending it again
// is safe.
func (c *Client) Cancel(ctx context.Context, id string) (cancelled bool, job protocol.Job, err error) {
	r, err := answer[protocol.JobCancel](ctx, c, &protocol.CancelJob{JobID: id})
	if err != nil {
		return false, protocol.Job{}, err
	}
	return r.Cancelled, r.Job, nil
}

// Wait polls a job until it is terminal or ctx ends, and returns its last snapshot.
func (c *Client) Wait(ctx context.Context, id string) (protocol.Job, error) {
	for poll := waitPoll.Start(); ; {
		job, err := c.Status(ctx, id)
		if err != nil {
			return job, err
		}
		if job.State.Terminal() {
			return job, nil
		}
		if !poll.Wait(ctx) {
			return job, fmt.Errorf("wait for job %s (%s): %w", id, job.State, ctx.Err())
		}
	}
}

// waitPoll is how often Wait asks: soon at first, for a short job.
var waitPoll = backoff.Policy{Base: 5 * time.Millisecond, Max: 250 * time.Millisecond}

// answer sends req and returns its reply, which must be a *T: any other is an error
// (unexpected's).
func answer[T any, P interface {
	*T
	protocol.Message
}](ctx context.Context, c *Client, req protocol.Message) (*T, error) {
	m, err := c.Do(ctx, req)
	if err != nil {
		return nil, err
	}
	if r, ok := m.(P); ok {
		return r, nil
	}
	return nil, unexpected(m)
}

func unexpected(m protocol.Message) error {
	switch e := m.(type) {
	case *protocol.Error:
		return &ServerError{Message: e.Message}
	case *protocol.SubmitRejected: // a request that submits, at capacity (a schedule's trigger)
		return &RejectedError{*e}
	}
	return fmt.Errorf("unexpected reply %s", m.MessageType())
}
