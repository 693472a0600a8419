package client

import (
	"context"
	"fmt"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/backoff"
)

// Defaults of WithSubmitRetries, those of the reference client.
const (
	DefaultSubmitRetryBase = 200 * time.Millisecond
	DefaultSubmitRetryMax  = 5 * time.Second
)

// submitRetry is how Submit answers an overloaded coordinator; the zero value never
// retries.
type submitRetry struct {
	n         int
	base, max time.Duration
}

// WithSubmitRetries makes Submit resend a submission the coordinator rejected for
// overload (SUBMIT_REJECTED with retryable=true) up to n more times, sleeping a random
// time in [0, min(max, base*2^i)) before retry i+1 ("full jitter"). base <= 0 and
// max <= 0 mean 200ms and 5s. Retries are off by default (n = 0).
//
// Nothing else is retried: an ERROR means the request was wrong, and a transport or
// protocol failure leaves unknown whether the job was created.
func WithSubmitRetries(n int, base, max time.Duration) Option {
	if base <= 0 {
		base = DefaultSubmitRetryBase
	}
	if max <= 0 {
		max = DefaultSubmitRetryMax
	}
	return func(c *Client) { c.retry = submitRetry{n: n, base: base, max: max} }
}

// submit sends req, resending it while the coordinator rejects it as retryable and
// retries remain. It returns the last reply.
func (c *Client) submit(ctx context.Context, req *protocol.SubmitJob) (protocol.Message, error) {
	for i := 0; ; i++ {
		m, err := c.Do(ctx, req)
		if err != nil {
			return nil, err
		}
		r, ok := m.(*protocol.SubmitRejected)
		if !ok || !r.Retryable || i >= c.retry.n {
			return m, nil
		}
		if !backoff.Sleep(ctx, c.retry.backoff(i)) {
			return nil, fmt.Errorf("%w (gave up retrying after %d attempts: %w)", &RejectedError{*r}, i+1, ctx.Err())
		}
	}
}

// backoff is the sleep before retry i+1: uniform in [0, min(max, base*2^i)).
func (r submitRetry) backoff(i int) time.Duration {
	return backoff.Policy{Base: r.base, Max: r.max, Jitter: 1}.Delay(i)
}
