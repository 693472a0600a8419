package natsreq_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/natsreq"
	"github.com/jobbus/jobbus/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher()) }

func connect(t *testing.T) *nats.Conn {
	t.Helper()
	srv, err := embeddednats.Start(context.Background(), embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func answer(t *testing.T, nc *nats.Conn, queue string, delay time.Duration) *nats.Subscription {
	t.Helper()
	sub, err := nc.QueueSubscribe("svc", queue, func(m *nats.Msg) {
		time.Sleep(delay)
		_ = m.Respond([]byte("ok"))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return sub
}

// frozen is a queue member that takes requests and never answers, as a SIGSTOPped
// process does until its server drops it.
func frozen(t *testing.T, nc *nats.Conn) *nats.Subscription {
	t.Helper()
	sub, err := nc.QueueSubscribeSync("svc", "q")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return sub
}

func TestResend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opts := natsreq.Options{FirstTry: 50 * time.Millisecond}

	t.Run("NoRespondersAtOnce", func(t *testing.T) {
		nc := connect(t)

		_, err := natsreq.Resend(ctx, nc, "svc", nil, opts)
		if !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("err = %v, want ErrNoResponders", err)
		}
	})
	t.Run("FrozenMemberIsGoneAround", func(t *testing.T) {
		// NATS picks a queue member at random. With one frozen member of two, a request
		// failed when its 8 sends in 10 s all went to the frozen one (1 in 256, so once
		// in 13 runs of 20 requests); with three that answer and sends from 20 ms on, 9
		// sends all go there about once in 13,000 runs, and most runs still send again.
		nc := connect(t)
		frozen(t, nc)
		for range 3 {
			answer(t, nc, "q", 0)
		}
		for i := range 20 {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			m, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{FirstTry: 20 * time.Millisecond})
			cancel()
			if err != nil || string(m.Data) != "ok" {
				t.Fatalf("request %d: %v, %v", i, m, err)
			}
		}
	})
	t.Run("SlowReplyToAnEarlierSendCounts", func(t *testing.T) {
		nc := connect(t)
		var calls atomic.Int32
		sub, err := nc.Subscribe("svc", func(m *nats.Msg) {
			if calls.Add(1) == 1 {
				time.Sleep(120 * time.Millisecond) // past the first try: a resend follows
			}
			_ = m.Respond([]byte("ok"))
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if m, err := natsreq.Resend(rctx, nc, "svc", nil, opts); err != nil || string(m.Data) != "ok" {
			t.Fatalf("%v, %v", m, err)
		}
	})
	t.Run("FrozenDroppedThenSuccessorServes", func(t *testing.T) {
		nc := connect(t)
		f := frozen(t, nc)
		go func() {
			time.Sleep(100 * time.Millisecond)
			_ = f.Unsubscribe() // its server dropped it: nobody serves for a moment
			time.Sleep(200 * time.Millisecond)
			answer(t, nc, "q", 0)
		}()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if m, err := natsreq.Resend(rctx, nc, "svc", nil, opts); err != nil || string(m.Data) != "ok" {
			t.Fatalf("%v, %v", m, err)
		}
	})
	t.Run("UnansweredUntilTheDeadline", func(t *testing.T) {
		nc := connect(t)
		frozen(t, nc)
		rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := natsreq.Resend(rctx, nc, "svc", nil, opts); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the deadline", err)
		}
	})
	t.Run("NobodyUntilTheDeadlineIsNoResponders", func(t *testing.T) {
		nc := connect(t)
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{FirstTry: 50 * time.Millisecond, WaitForResponders: true})
		if !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("err = %v, want ErrNoResponders (nobody served while it waited)", err)
		}
	})
	t.Run("WaitsForResponders", func(t *testing.T) {
		nc := connect(t)
		go func() {
			time.Sleep(100 * time.Millisecond)
			answer(t, nc, "q", 0)
		}()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		m, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{FirstTry: 50 * time.Millisecond, WaitForResponders: true})
		if err != nil || string(m.Data) != "ok" {
			t.Fatalf("%v, %v", m, err)
		}
	})
}

// TestRequest: Request sends a read-only request again when it goes unanswered, and a
// submission or a cancel only while nobody serves its subject.
func TestRequest(t *testing.T) {
	t.Parallel()
	status, submit := endpoint(t, protocol.TypeGetJobStatus), endpoint(t, protocol.TypeSubmitJob)
	opts := natsreq.Options{FirstTry: 50 * time.Millisecond}

	t.Run("ReadOnlyUnansweredIsSentAgain", func(t *testing.T) {
		t.Parallel()
		nc := connect(t)
		f := frozenAt(t, nc, status)
		go func() {
			time.Sleep(100 * time.Millisecond) // past the first try
			_ = f.Unsubscribe()                // its server dropped it
			answerAt(t, nc, status)
		}()
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if m, err := natsreq.Request(rctx, nc, status, nil, opts); err != nil || string(m.Data) != "ok" {
			t.Fatalf("%v, %v", m, err)
		}
	})
	t.Run("SubmissionUnansweredIsNotSentAgain", func(t *testing.T) {
		t.Parallel()
		nc := connect(t)
		f := frozenAt(t, nc, submit)
		var answered atomic.Int32
		go func() {
			time.Sleep(100 * time.Millisecond)
			_ = f.Unsubscribe()
			sub, _ := nc.QueueSubscribe(submit, "q", func(m *nats.Msg) {
				answered.Add(1)
				_ = m.Respond([]byte("ok"))
			})
			t.Cleanup(func() { _ = sub.Unsubscribe() })
		}()
		rctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if _, err := natsreq.Request(rctx, nc, submit, nil, natsreq.Options{FirstTry: 50 * time.Millisecond, WaitForResponders: true}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the deadline", err)
		}
		if n := answered.Load(); n != 0 {
			t.Fatalf("the submission was sent again: answered %d times", n)
		}
	})
	t.Run("SubmissionWaitsForResponders", func(t *testing.T) {
		t.Parallel()
		nc := connect(t)
		go func() {
			time.Sleep(100 * time.Millisecond)
			answerAt(t, nc, submit)
		}()
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if m, err := natsreq.Request(rctx, nc, submit, nil, natsreq.Options{WaitForResponders: true}); err != nil || string(m.Data) != "ok" {
			t.Fatalf("%v, %v", m, err)
		}
	})
	t.Run("SubmissionWithoutRespondersAtOnce", func(t *testing.T) {
		t.Parallel()
		nc := connect(t)
		if _, err := natsreq.Request(context.Background(), nc, submit, nil, natsreq.Options{}); !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("err = %v, want ErrNoResponders", err)
		}
	})
}

func endpoint(t *testing.T, typ protocol.Type) string {
	t.Helper()
	e, ok := protocol.EndpointFor(typ)
	if !ok {
		t.Fatalf("no endpoint for %s", typ)
	}
	return e.Subject()
}

// frozenAt is a queue member of subject that takes requests and never answers.
func frozenAt(t *testing.T, nc *nats.Conn, subject string) *nats.Subscription {
	t.Helper()
	sub, err := nc.QueueSubscribeSync(subject, "q")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return sub
}

// answerAt is a queue member of subject that answers "ok".
func answerAt(t *testing.T, nc *nats.Conn, subject string) {
	sub, err := nc.QueueSubscribe(subject, "q", func(m *nats.Msg) { _ = m.Respond([]byte("ok")) })
	if err != nil {
		t.Error(err)
		return
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}
