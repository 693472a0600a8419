package natsreq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
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
		// The first send's own wait (DefaultFirstTry), not opts' 50 ms: a loaded
		// machine may take longer to say nobody is subscribed, and a send unanswered
		// makes the request wait out "no responders" until its context ends, which
		// a test's bound (not Background) must then be.
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{})
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
	t.Run("UnansweredWithin", func(t *testing.T) {
		nc := connect(t)
		frozen(t, nc)
		start := time.Now()
		_, err := natsreq.Resend(ctx, nc, "svc", nil, natsreq.Options{FirstTry: 50 * time.Millisecond, Within: 300 * time.Millisecond})
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Second {
			t.Fatalf("err = %v after %v, want the deadline Within set", err, time.Since(start))
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

// refuse answers every request on svc at once with a "not serving" reply, as a
// coordinator whose lease lapsed does, without a queue group (as the coordinator's API).
func refuse(t *testing.T, nc *nats.Conn) {
	t.Helper()
	sub, err := nc.Subscribe("svc", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Header.Set("Refused", "1")
		_ = nc.PublishMsg(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

func refused(m *nats.Msg) bool { return m.Header.Get("Refused") != "" }

func TestResendRidesOutAFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	for _, fresh := range []bool{false, true} {
		t.Run(fmt.Sprintf("UnservedIsWaitedPast/Fresh=%v", fresh), func(t *testing.T) {
			// The refusal comes first every time; the answer a little later.
			nc := connect(t)
			refuse(t, nc)
			sub, err := nc.Subscribe("svc", func(m *nats.Msg) {
				time.Sleep(20 * time.Millisecond)
				_ = m.Respond([]byte("ok"))
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			m, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{FirstTry: time.Second, Fresh: fresh, Unserved: refused})
			if err != nil || string(m.Data) != "ok" {
				t.Fatalf("%v, %v", m, err)
			}
		})
	}
	t.Run("OnlyUnservedReturnsTheLastRefusal", func(t *testing.T) {
		nc := connect(t)
		refuse(t, nc)
		rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		m, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{Fresh: true, Unserved: refused})
		if err != nil || !refused(m) {
			t.Fatalf("%v, %v; want the refusal", m, err)
		}
	})
	for _, h := range []nats.Header{{"Id": {"r1"}}} {
		t.Run(fmt.Sprintf("EverySendCarriesTheHeaderAndItsNumber/%d", len(h)), func(t *testing.T) {
			nc := connect(t)
			var mu sync.Mutex
			var tries []string
			sub, err := nc.Subscribe("svc", func(m *nats.Msg) {
				mu.Lock()
				defer mu.Unlock()
				if m.Header.Get("Id") != "r1" {
					t.Errorf("send without the header: %v", m.Header)
				}
				tries = append(tries, m.Header.Get("Try"))
				if len(tries) == 3 {
					_ = m.Respond([]byte("ok"))
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			m, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{FirstTry: 20 * time.Millisecond, Fresh: true, Header: h, TryHeader: "Try"})
			if err != nil || string(m.Data) != "ok" {
				t.Fatalf("%v, %v", m, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(tries, []string{"", "2", "3"}) {
				t.Fatalf("tries %q, want none, 2, 3", tries)
			}
		})
	}
	t.Run("EverySendSaysTheTimeLeft", func(t *testing.T) {
		nc := connect(t)
		var mu sync.Mutex
		var left []int
		sub, err := nc.Subscribe("svc", func(m *nats.Msg) {
			mu.Lock()
			defer mu.Unlock()
			ms, _ := strconv.Atoi(m.Header.Get("Left"))
			left = append(left, ms)
			if len(left) == 2 {
				_ = m.Respond([]byte("ok"))
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		m, err := natsreq.Resend(ctx, nc, "svc", nil, natsreq.Options{FirstTry: 100 * time.Millisecond, Fresh: true, Within: 10 * time.Second, TimeoutHeader: "Left"})
		if err != nil || string(m.Data) != "ok" {
			t.Fatalf("%v, %v", m, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(left) != 2 || left[0] <= 9000 || left[0] > 10000 || left[1] >= left[0] || left[1] < left[0]-5000 {
			t.Fatalf("sends said %v ms left, want two, about 10 s and a little less", left)
		}
	})
	t.Run("NobodyDecides", func(t *testing.T) {
		nc := connect(t)
		gone := errors.New("nothing runs")
		_, err := natsreq.Resend(ctx, nc, "svc", nil, natsreq.Options{Nobody: func(context.Context) error { return gone }})
		if !errors.Is(err, gone) {
			t.Fatalf("err = %v, want Nobody's", err)
		}

		var asked atomic.Int32
		go func() {
			time.Sleep(100 * time.Millisecond)
			answer(t, nc, "q", 0)
		}()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		m, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{Nobody: func(context.Context) error { asked.Add(1); return nil }})
		if err != nil || string(m.Data) != "ok" || asked.Load() != 1 {
			t.Fatalf("%v, %v, Nobody asked %d times; want the answer, Nobody asked once", m, err, asked.Load())
		}
	})
	t.Run("AnAnnouncementSendsAgainAtOnce", func(t *testing.T) {
		// The first send goes to a frozen member; a second send waits 2 s, but a new
		// responder announces itself after about 1.2 s: the request is answered then.
		nc := connect(t)
		frozen(t, nc)
		time.AfterFunc(1200*time.Millisecond, func() {
			sub, err := nc.Subscribe("svc", func(m *nats.Msg) { _ = m.Respond([]byte("ok")) })
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			_ = nc.Flush()
			_ = nc.Publish("svc.leader", nil)
		})
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		m, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{FirstTry: time.Second, Fresh: true, Wake: "svc.leader"})
		if err != nil || string(m.Data) != "ok" {
			t.Fatalf("%v, %v", m, err)
		}
		// Without the announcement, the third send would go at 3 s.
		if took := time.Since(start); took > 2800*time.Millisecond {
			t.Fatalf("answered after %v: the announcement did not send it again", took)
		}
	})
	t.Run("TakenThenNobodyIsUnanswered", func(t *testing.T) {
		// The frozen member takes the first send, then goes (its server dropped it):
		// nobody serves until the end, but the first send may have been acted on.
		nc := connect(t)
		f := frozen(t, nc)
		time.AfterFunc(150*time.Millisecond, func() { _ = f.Unsubscribe() })
		rctx, cancel := context.WithTimeout(ctx, 600*time.Millisecond)
		defer cancel()
		_, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{FirstTry: 100 * time.Millisecond, Fresh: true})
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("err = %v, want the deadline: a send was taken", err)
		}
	})
	t.Run("TakenThenRefusedIsUnanswered", func(t *testing.T) {
		// The first send is taken and never answered; every later one is refused: the
		// refusals say nothing of the first, which may have been acted on.
		nc := connect(t)
		var n atomic.Int32
		sub, err := nc.Subscribe("svc", func(m *nats.Msg) {
			if n.Add(1) > 1 {
				r := nats.NewMsg(m.Reply)
				r.Header.Set("Refused", "1")
				_ = nc.PublishMsg(r)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		m, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{FirstTry: 100 * time.Millisecond, Fresh: true, Unserved: refused})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%v, %v; want the deadline: the first send was taken", m, err)
		}
	})
	t.Run("UnsureIsSentAgainWhileTimeIsLeft", func(t *testing.T) {
		// The first answer is unsure, the second settled; with too little time left the
		// unsure one is the answer.
		for _, tc := range []struct {
			within time.Duration
			want   string
		}{{10 * time.Second, "settled"}, {150 * time.Millisecond, "unsure"}} {
			nc := connect(t)
			var n atomic.Int32
			sub, err := nc.Subscribe("svc", func(m *nats.Msg) {
				if n.Add(1) == 1 {
					_ = m.Respond([]byte("unsure"))
					return
				}
				_ = m.Respond([]byte("settled"))
			})
			if err != nil {
				t.Fatal(err)
			}
			m, err := natsreq.Resend(ctx, nc, "svc", nil, natsreq.Options{FirstTry: time.Second, Fresh: true, Within: tc.within,
				Unsure: func(m *nats.Msg) bool { return string(m.Data) == "unsure" }})
			_ = sub.Unsubscribe()
			if err != nil || string(m.Data) != tc.want {
				t.Fatalf("within %v: %v, %v; want %s", tc.within, m, err, tc.want)
			}
		}
	})
	t.Run("TakenThenCutOff", func(t *testing.T) {
		nc := connect(t)
		frozen(t, nc)
		time.AfterFunc(150*time.Millisecond, nc.Close)
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{FirstTry: 100 * time.Millisecond, Fresh: true})
		if !errors.Is(err, natsreq.ErrCutOff) {
			t.Fatalf("err = %v, want ErrCutOff: a send was taken before the connection closed", err)
		}
	})
	t.Run("NoSendAgainOnceClosed", func(t *testing.T) {
		nc := connect(t)
		frozen(t, nc)
		time.AfterFunc(50*time.Millisecond, nc.Close)
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := natsreq.Resend(rctx, nc, "svc", nil, natsreq.Options{FirstTry: 100 * time.Millisecond, Fresh: true})
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("err = %v, want the connection closed", err)
		}
	})
}

// TestRequest: Request sends a read-only request again when it goes unanswered, a
// submission too under its request id, and a cancel only while nobody serves its
// subject.
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
	// Each send of a submission carries the caller's headers, its request id and the
	// time it has left; a send again its number too.
	t.Run("SubmissionHeaders", func(t *testing.T) {
		t.Parallel()
		nc := connect(t)
		var mu sync.Mutex
		var sends []nats.Header
		sub, err := nc.Subscribe(submit, func(m *nats.Msg) {
			mu.Lock()
			defer mu.Unlock()
			sends = append(sends, m.Header)
			if len(sends) > 1 { // the first goes unanswered
				_ = m.Respond([]byte("ok"))
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		caller := nats.Header{"Traceparent": []string{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
		const within = 10 * time.Second
		if m, err := natsreq.Request(context.Background(), nc, submit, nil, natsreq.Options{RequestID: "r-h", Header: caller, Within: within}); err != nil || string(m.Data) != "ok" {
			t.Fatalf("%v, %v", m, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(sends) != 2 {
			t.Fatalf("%d sends, want 2", len(sends))
		}
		for i, h := range sends {
			if h.Get(protocol.HeaderRequestID) != "r-h" || h.Get("Traceparent") != caller.Get("Traceparent") {
				t.Errorf("send %d: headers %v, want the request id and the caller's", i+1, h)
			}
			ms, err := strconv.Atoi(h.Get(protocol.HeaderTimeout))
			if err != nil || ms <= 0 || ms > int(within.Milliseconds()) {
				t.Errorf("send %d: %s %q, want the milliseconds left", i+1, protocol.HeaderTimeout, h.Get(protocol.HeaderTimeout))
			}
			if try, want := h.Get(protocol.HeaderRequestTry), []string{"", "2"}[i]; try != want {
				t.Errorf("send %d: %s %q, want %q", i+1, protocol.HeaderRequestTry, try, want)
			}
		}
		if len(caller) != 1 {
			t.Errorf("the caller's header changed: %v", caller)
		}
	})
	for _, tc := range []struct{ name, subject string }{
		{"Submission", submit},
		{"BatchOfSubmissions", endpoint(t, protocol.TypeSubmitJobs)},
	} {
		t.Run(tc.name+"UnansweredIsSentAgainUnderItsRequestID", func(t *testing.T) {
			t.Parallel()
			submit := tc.subject
			nc := connect(t)
			f := frozenAt(t, nc, submit)
			var mu sync.Mutex
			var seen []string
			go func() {
				time.Sleep(100 * time.Millisecond)
				_ = f.Unsubscribe()
				sub, _ := nc.QueueSubscribe(submit, "q", func(m *nats.Msg) {
					mu.Lock()
					seen = append(seen, m.Header.Get(protocol.HeaderRequestID)+" "+m.Header.Get(protocol.HeaderRequestTry))
					mu.Unlock()
					_ = m.Respond([]byte("ok"))
				})
				t.Cleanup(func() { _ = sub.Unsubscribe() })
			}()
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if m, err := natsreq.Request(rctx, nc, submit, nil, natsreq.Options{WaitForResponders: true, RequestID: "r-1"}); err != nil || string(m.Data) != "ok" {
				t.Fatalf("%v, %v", m, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(seen) == 0 || !strings.HasPrefix(seen[0], "r-1 ") || strings.HasSuffix(seen[0], " 1") {
				t.Fatalf("sends seen %q, want the request id r-1 sent again (try 2 or later)", seen)
			}
		})
	}
	t.Run("CancelUnansweredIsNotSentAgain", func(t *testing.T) {
		t.Parallel()
		cancelSubject := endpoint(t, protocol.TypeCancelJob)
		nc := connect(t)
		f := frozenAt(t, nc, cancelSubject)
		var answered atomic.Int32
		go func() {
			time.Sleep(100 * time.Millisecond)
			_ = f.Unsubscribe()
			sub, _ := nc.QueueSubscribe(cancelSubject, "q", func(m *nats.Msg) {
				answered.Add(1)
				_ = m.Respond([]byte("ok"))
			})
			t.Cleanup(func() { _ = sub.Unsubscribe() })
		}()
		rctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		if _, err := natsreq.Request(rctx, nc, cancelSubject, nil, natsreq.Options{WaitForResponders: true}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the deadline", err)
		}
		if n := answered.Load(); n != 0 {
			t.Fatalf("the cancel was sent again: answered %d times", n)
		}
	})
	t.Run("SubmissionOutcomeUnknownIsNotTurnedIntoARefusal", func(t *testing.T) {
		// A first send answered "Outcome unknown" may have created the job: a later
		// send refused by a coordinator that is not serving must not be the request's
		// last word, or an ERROR would be answered for a job that is stored.
		t.Parallel()
		nc := connect(t)
		var sends atomic.Int32
		sub, err := nc.QueueSubscribe(submit, "q", func(m *nats.Msg) {
			r := nats.NewMsg(m.Reply)
			if sends.Add(1) == 1 {
				r.Header.Set(micro.ErrorCodeHeader, "504")
				r.Header.Set(micro.ErrorHeader, protocol.OutcomeUnknownPrefix+" job j-1: not confirmed in time")
			} else {
				r.Header.Set(micro.ErrorCodeHeader, "503")
				r.Header.Set(micro.ErrorHeader, "coordinator is not serving")
			}
			_ = m.RespondMsg(r)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		rctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		defer cancel()
		m, err := natsreq.Request(rctx, nc, submit, nil, natsreq.Options{})
		if err != nil || !strings.HasPrefix(m.Header.Get(micro.ErrorHeader), protocol.OutcomeUnknownPrefix) {
			t.Fatalf("answer %v (%v), want the Outcome unknown one", m, err)
		}
		if n := sends.Load(); n < 2 {
			t.Fatalf("sent %d times, want the unsure answer waited past and sent again", n)
		}
	})
	t.Run("SendAfterARefusalLeftUnansweredIsNotTheRefusal", func(t *testing.T) {
		// A first send refused by a coordinator that is not serving, then sent again:
		// the new leader takes it (and may store the job) but answers too late. The
		// request's last word is that its outcome is unknown, not the refusal.
		t.Parallel()
		nc := connect(t)
		var sends atomic.Int32
		sub, err := nc.QueueSubscribe(submit, "q", func(m *nats.Msg) {
			if sends.Add(1) > 1 {
				return // taken, never answered in time
			}
			answerNotServing(m)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		rctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
		defer cancel()
		m, err := natsreq.Request(rctx, nc, submit, nil, natsreq.Options{})
		if err == nil || m != nil {
			t.Fatalf("answer %v (%v), want no answer: the send after the refusal may have been acted on", m, err)
		}
		if n := sends.Load(); n < 2 {
			t.Fatalf("sent %d times, want the refusal waited past and sent again", n)
		}
	})
	t.Run("SubmissionRefusedByOneWhileAnotherTookIt", func(t *testing.T) {
		// Every coordinator gets each request: a deposed one refuses every send at
		// once, while the new leader takes them and answers too late. The refusals
		// are not the request's last word: its outcome is unknown.
		t.Parallel()
		nc := connect(t)
		deposed, err := nc.Subscribe(submit, func(m *nats.Msg) {
			answerNotServing(m)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = deposed.Unsubscribe() })
		var taken atomic.Int32
		leader, err := nc.Subscribe(submit, func(*nats.Msg) { taken.Add(1) }) // stores it, answers late
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = leader.Unsubscribe() })
		rctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
		defer cancel()
		m, err := natsreq.Request(rctx, nc, submit, nil, natsreq.Options{})
		var refused *natsreq.RefusedError
		if m != nil || !errors.As(err, &refused) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("answer %v (%v), want a RefusedError: the leader may have stored it", m, err)
		}
		if taken.Load() == 0 {
			t.Fatal("the leader got no send")
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

// answerNotServing answers m as a coordinator that is not serving does (code 503).
func answerNotServing(m *nats.Msg) {
	r := nats.NewMsg(m.Reply)
	r.Header.Set(micro.ErrorCodeHeader, "503")
	r.Header.Set(micro.ErrorHeader, "coordinator is not serving")
	_ = m.RespondMsg(r)
}
