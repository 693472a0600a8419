package client_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

var submitSubject = func() string { e, _ := protocol.EndpointFor(protocol.TypeSubmitJob); return e.Subject() }()

// serveSubmit answers the submit endpoint with fn's reply (nil: none) on nc, without a
// queue group, as the coordinator's API does.
func serveSubmit(t *testing.T, nc *nats.Conn, fn func(m *nats.Msg) *nats.Msg) {
	t.Helper()
	sub, err := nc.Subscribe(submitSubject, func(m *nats.Msg) {
		if r := fn(m); r != nil {
			r.Subject = m.Reply
			_ = nc.PublishMsg(r)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

func submitted(id string) *nats.Msg {
	return &nats.Msg{Data: mustEncode(&protocol.JobSubmitted{JobID: id})}
}

// notServingReply is a coordinator's answer while its lease has lapsed.
func notServingReply() *nats.Msg {
	m := nats.NewMsg("")
	m.Data = mustEncode(&protocol.Error{Message: "coordinator is not serving: this coordinator's leader lease may have run out"})
	m.Header.Set(micro.ErrorHeader, "coordinator is not serving")
	m.Header.Set(micro.ErrorCodeHeader, "503")
	return m
}

// standBy answers coordinator presence on nc, as a standby coordinator does.
func standBy(t *testing.T, nc *nats.Conn) {
	t.Helper()
	sub, err := nc.Subscribe(protocol.CoordinatorsSubject, func(m *nats.Msg) { _ = m.Respond([]byte(`{"state":"standby"}`)) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

func TestSubmitSentAgainUnderOneRequestID(t *testing.T) {
	t.Parallel()
	nc := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
	var mu sync.Mutex
	var ids, tries []string
	serveSubmit(t, nc, func(m *nats.Msg) *nats.Msg {
		mu.Lock()
		defer mu.Unlock()
		ids = append(ids, m.Header.Get(protocol.HeaderRequestID))
		tries = append(tries, m.Header.Get(protocol.HeaderRequestTry))
		if len(tries) < 3 { // lost, as in a frozen leader
			return nil
		}
		return submitted(protocol.RequestJobID(ids[0]))
	})
	id, err := client.New(nc, client.WithTimeout(10*time.Second)).Submit(context.Background(), "SHA256", map[string]string{"text": "x"})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(tries, ",") != ",2,3" || ids[0] == "" || ids[1] != ids[0] || ids[2] != ids[0] || id != protocol.RequestJobID(ids[0]) {
		t.Fatalf("sends with request ids %q, tries %q, answered %s: want one request id, tries (none),2,3, and its job", ids, tries, id)
	}
}

// TestNotServingAnswerIsWaitedPast: a deposed coordinator that answers at once that
// it does not serve does not hide its successor's answer.
func TestNotServingAnswerIsWaitedPast(t *testing.T) {
	t.Parallel()
	nc := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
	serveSubmit(t, nc, func(*nats.Msg) *nats.Msg { return notServingReply() })
	serveSubmit(t, nc, func(m *nats.Msg) *nats.Msg {
		time.Sleep(20 * time.Millisecond)
		return submitted(protocol.RequestJobID(m.Header.Get(protocol.HeaderRequestID)))
	})
	id, err := client.New(nc, client.WithTimeout(10*time.Second)).Submit(context.Background(), "SHA256", map[string]string{"text": "x"})
	if err != nil || id == "" {
		t.Fatalf("Submit = %q, %v; want the serving coordinator's job", id, err)
	}

	// Alone, the refusal is the answer once the request's time is up.
	only := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
	serveSubmit(t, only, func(*nats.Msg) *nats.Msg { return notServingReply() })
	_, err = client.New(only, client.WithTimeout(300*time.Millisecond)).Submit(context.Background(), "SHA256", map[string]string{"text": "x"})
	if !errors.Is(err, client.ErrServer) || !strings.Contains(err.Error(), "not serving") {
		t.Fatalf("Submit = %v, want the refusal", err)
	}
}

// TestNoCoordinatorDuringAFailover: a request that finds no coordinator serving while a
// coordinator process stands by says so once, waits, and is answered by the one that
// takes over; if none does in time, its error blames the failover, not a missing
// `jobbus serve`. With no coordinator process at all, it fails at once with the hint.
func TestNoCoordinatorDuringAFailover(t *testing.T) {
	t.Parallel()
	t.Run("TakenOver", func(t *testing.T) {
		t.Parallel()
		nc := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
		standBy(t, nc)
		var notices atomic.Int32
		c := client.New(nc, client.WithTimeout(10*time.Second), client.WithFailoverNotice(func(msg string) {
			if msg == client.FailoverNotice {
				notices.Add(1)
			}
		}))
		time.AfterFunc(300*time.Millisecond, func() {
			serveSubmit(t, nc, func(m *nats.Msg) *nats.Msg {
				return submitted(protocol.RequestJobID(m.Header.Get(protocol.HeaderRequestID)))
			})
		})
		if _, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": "x"}); err != nil {
			t.Fatal(err)
		}
		if n := notices.Load(); n != 1 {
			t.Fatalf("%d notices, want 1", n)
		}
	})
	t.Run("NotInTime", func(t *testing.T) {
		t.Parallel()
		nc := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
		standBy(t, nc)
		_, err := client.New(nc, client.WithTimeout(time.Second)).Status(context.Background(), "x")
		if !errors.Is(err, client.ErrNoCoordinator) || !strings.Contains(err.Error(), "no coordinator is serving right now (a failover takes about the leader lease)") ||
			strings.Contains(err.Error(), "running?") {
			t.Fatalf("Status = %v, want ErrNoCoordinator blaming the failover", err)
		}
	})
	t.Run("NothingRuns", func(t *testing.T) {
		t.Parallel()
		nc := jobbustest.Start(t, jobbustest.WithoutCoordinator()).NC
		var notices atomic.Int32
		c := client.New(nc, client.WithTimeout(time.Minute), client.WithFailoverNotice(func(string) { notices.Add(1) }))
		start := time.Now()
		_, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": "x"})
		if !errors.Is(err, client.ErrNoCoordinator) || strings.Count(err.Error(), "(is `jobbus serve` running?)") != 1 || notices.Load() != 0 {
			t.Fatalf("Submit = %v (%d notices), want ErrNoCoordinator with the hint once, no notice", err, notices.Load())
		}
		if took := time.Since(start); took > 30*time.Second { // a bound, far short of the minute
			t.Fatalf("gave up after %v: it waited for a failover", took)
		}
	})
}
