package client_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// transports start a peer answering with h and return a client to it and the count of
// requests the peer received: the retry policy is the client's, the same on both.
var transports = []struct {
	name  string
	start func(t *testing.T, h handler, opts ...client.Option) (*client.Client, *atomic.Int32)
}{
	{"TCP", func(t *testing.T, h handler, opts ...client.Option) (*client.Client, *atomic.Int32) {
		p := newBridgePeer(t, h)
		return dial(t, p.addr(), opts...), &p.requests
	}},
	{"NATS", startNATSPeer},
}

// startNATSPeer answers the coordinator's submit endpoint on a real embedded NATS
// server. A hang-up or silence becomes no reply at all.
func startNATSPeer(t *testing.T, h handler, opts ...client.Option) (*client.Client, *atomic.Int32) {
	t.Helper()
	nc := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
	var requests atomic.Int32
	e, _ := protocol.EndpointFor(protocol.TypeSubmitJob)
	sub, err := nc.Subscribe(e.Subject(), func(msg *nats.Msg) {
		req, err := protocol.Decode(msg.Data)
		if err != nil {
			_ = msg.Respond(mustEncode(protocol.MalformedRequest(err)))
			return
		}
		resp := h(int(requests.Add(1)), req)
		if resp.hangUp || resp.silent {
			return
		}
		_ = msg.Respond(mustEncode(resp.reply))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	c := client.New(nc, opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c, &requests
}

// rejectThenAccept rejects the first n submissions, retryable, then accepts.
func rejectThenAccept(n int) handler {
	return func(i int, req protocol.Message) response {
		if i <= n {
			return response{reply: protocol.AtCapacity(10, 10)}
		}
		return response{reply: &protocol.JobSubmitted{JobID: "job-1"}}
	}
}

func TestSubmitRetries(t *testing.T) {
	t.Parallel()
	const base, max = time.Millisecond, 4 * time.Millisecond
	tests := []struct {
		name     string
		retries  int
		handle   handler
		requests int32
		wantErr  error // nil: the job is submitted
	}{
		{"RejectedTwiceThenAccepted", 3, rejectThenAccept(2), 3, nil},
		{"RetriesRunOut", 1, rejectThenAccept(2), 2, client.ErrRejected},
		{"OffByDefault", 0, rejectThenAccept(1), 1, client.ErrRejected},
		{"NotRetryable", 3, func(int, protocol.Message) response {
			r := protocol.AtCapacity(10, 10)
			r.Retryable = false
			return response{reply: r}
		}, 1, client.ErrRejected},
		{"ErrorNeverRetried", 3, func(int, protocol.Message) response {
			return response{reply: protocol.InvalidPayload("Field 'text' must be a string")}
		}, 1, client.ErrServer},
		// Over TCP the bridge sends it again where that is safe (bridge/failover.go);
		// over NATS the client does, a submission carrying a request id
		// (TestSubmitSentAgainUnderOneRequestID), so it is counted there.
		{"TransportFailureNeverRetried", 3, func(int, protocol.Message) response {
			return response{hangUp: true}
		}, 1, errTransport},
	}
	for _, tr := range transports {
		for _, tt := range tests {
			t.Run(tr.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				opts := []client.Option{client.WithTimeout(2 * time.Second)}
				if tt.retries > 0 {
					opts = append(opts, client.WithSubmitRetries(tt.retries, base, max))
				}
				c, requests := tr.start(t, tt.handle, opts...)
				id, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": "x"})
				switch {
				case tt.wantErr == nil && (err != nil || id != "job-1"):
					t.Fatalf("Submit = %q, %v, want job-1", id, err)
				case tt.wantErr == errTransport && tr.name == "NATS":
					// Sent under a request id, left unanswered: the job it names may exist.
					if job, ok := client.OutcomeJob(err); !errors.Is(err, client.ErrOutcomeUnknown) || !ok || job == "" {
						t.Fatalf("Submit = %v, want an unknown outcome naming the job", err)
					}
				case tt.wantErr == errTransport && (err == nil || errors.Is(err, client.ErrRejected) || errors.Is(err, client.ErrServer)):
					t.Fatalf("Submit = %v, want a transport error", err)
				case tt.wantErr != nil && tt.wantErr != errTransport && !errors.Is(err, tt.wantErr):
					t.Fatalf("Submit = %q, %v, want %v", id, err, tt.wantErr)
				}
				got := requests.Load()
				if tr.name == "NATS" && tt.wantErr == errTransport {
					// Unanswered, it is sent again a second later, under its request id.
					if got < 2 {
						t.Fatalf("%d requests, want the submission sent again", got)
					}
				} else if got != tt.requests {
					t.Fatalf("%d requests, want %d", got, tt.requests)
				}
			})
		}
	}
}

// errTransport marks a case expecting a failure that is neither ERROR nor rejection.
var errTransport = errors.New("any transport error")

func TestSubmitRetriesCarryTheRejection(t *testing.T) {
	t.Parallel()
	c, _ := transports[0].start(t, rejectThenAccept(5), client.WithSubmitRetries(1, time.Millisecond, time.Millisecond))
	_, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": "x"})
	var re *client.RejectedError
	if !errors.As(err, &re) || re.ActiveCount != 10 || re.Limit != 10 || !re.Retryable ||
		re.Reason != "coordinator at capacity: 10 active jobs (limit 10)" {
		t.Fatalf("Submit = %#v, want the last SUBMIT_REJECTED", err)
	}
}

func TestSubmitRetriesStopWithTheContext(t *testing.T) {
	t.Parallel()
	c, requests := transports[0].start(t, rejectThenAccept(5), client.WithSubmitRetries(5, time.Hour, time.Hour))
	// Long enough for the first answer to arrive on a loaded machine, far short of the
	// hour-long backoff that must be cut short.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := c.Submit(ctx, "SHA256", map[string]string{"text": "x"})
	if !errors.Is(err, client.ErrRejected) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Submit = %v, want ErrRejected and the context's end", err)
	}
	if got := requests.Load(); got != 1 {
		t.Fatalf("%d requests, want 1", got)
	}
}

// TestSubmitCancelledAfterItWentIsOutcomeUnknown: a caller that cancels Submit after
// its submission was received does not learn that it was not stored (a coordinator
// may have stored it): it hears ErrOutcomeUnknown naming the job, as when its deadline
// passes.
func TestSubmitCancelledAfterItWentIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t, jobbustest.WithoutCoordinator())
	e, _ := protocol.EndpointFor(protocol.TypeSubmitJob)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rid := make(chan string, 1)
	// A coordinator that takes the submission and has not answered when the caller
	// gives up.
	overhear(t, sys.NC, e.Subject(), func(m *nats.Msg) {
		select {
		case rid <- m.Header.Get(protocol.HeaderRequestID):
			cancel()
		default:
		}
	})
	c := client.New(sys.NC, client.WithTimeout(time.Minute))
	_, err := c.Submit(ctx, "SHA256", map[string]string{"text": "x"})
	job, ok := client.OutcomeJob(err)
	if !errors.Is(err, client.ErrOutcomeUnknown) || !ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("Submit = %v, want an unknown outcome naming the job, and context.Canceled", err)
	}
	if want := protocol.RequestJobID(<-rid); job != want {
		t.Fatalf("OutcomeJob = %s, want %s", job, want)
	}
}

// TestWithTimeoutZeroKeepsTheDefault: WithTimeout(0) leaves the default bound, as the
// worker's Timeout(0) does, on both transports (TCP failed every request at once, and
// NATS left it unbounded).
func TestWithTimeoutZeroKeepsTheDefault(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			c, _ := tr.start(t, rejectThenAccept(0), client.WithTimeout(0))
			if id, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": "x"}); err != nil || id != "job-1" {
				t.Fatalf("Submit = %q, %v, want job-1", id, err)
			}
		})
	}
}
