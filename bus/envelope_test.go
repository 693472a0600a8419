package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus"
)

// TestEnvelope2Wire: tells, asks and RESPONSE answers of an Envelope2 node carry no
// headers (what they would say is in the subject and the reply), an ERROR answer
// keeps its kind and code.
func TestEnvelope2Wire(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	raw := dial(t, s.url)
	c := connect(t, s.url, coordinator("c1"), bus.WithEnvelope(bus.Envelope2))
	w := connect(t, s.url, worker("w1"), bus.WithEnvelope(bus.Envelope2))
	must(t, w.Handle("echo", func(_ context.Context, r *bus.Request) (any, error) { return r.Data, nil }))
	must(t, w.Handle("fail", func(context.Context, *bus.Request) (any, error) {
		return nil, bus.WithCode(bus.CodeNotFound, errors.New("no such thing"))
	}))

	// What the coordinator sends to the worker, and what the worker answers.
	toWorker, err := raw.SubscribeSync("jobbus.node.worker.w1.coordinator.c1.>")
	must(t, err)
	answers, err := raw.SubscribeSync("_INBOX.>")
	must(t, err)
	must(t, raw.Flush())

	must(t, c.Tell(context.Background(), w.Self(), "note", []byte(`{"n":1}`)))
	m, err := toWorker.NextMsg(10 * time.Second)
	must(t, err)
	if len(m.Header) != 0 || m.Reply != "" || string(m.Data) != `{"n":1}` {
		t.Fatalf("tell: headers %v, reply %q, data %q; want none, none, the payload", m.Header, m.Reply, m.Data)
	}

	got, err := bus.Ask[[]byte](context.Background(), c, w.Self(), "echo", []byte(`{"n":2}`))
	if err != nil || string(got) != `{"n":2}` {
		t.Fatalf("ask = %q, %v", got, err)
	}
	m, err = toWorker.NextMsg(10 * time.Second)
	must(t, err)
	if len(m.Header) != 0 || m.Reply == "" || m.Subject != "jobbus.node.worker.w1.coordinator.c1.echo" {
		t.Fatalf("ask on %s: headers %v, reply %q; want none and a reply", m.Subject, m.Header, m.Reply)
	}
	a, err := answers.NextMsg(10 * time.Second)
	must(t, err)
	if len(a.Header) != 0 || string(a.Data) != `{"n":2}` {
		t.Fatalf("answer: headers %v, data %q; want none, the payload", a.Header, a.Data)
	}

	_, err = bus.Ask[[]byte](context.Background(), c, w.Self(), "fail", nil)
	if !errors.Is(err, bus.CodeNotFound) {
		t.Fatalf("ask fail = %v, want CodeNotFound", err)
	}
	if _, err := toWorker.NextMsg(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	a, err = answers.NextMsg(10 * time.Second)
	must(t, err)
	if a.Header.Get(bus.HeaderKind) != "ERROR" || a.Header.Get(bus.HeaderErrorCode) != "404" {
		t.Fatalf("error answer headers %v, want kind ERROR and code 404", a.Header)
	}

	cs := c.Stats()
	if cs.Sent.Tell != 1 || cs.Sent.Ask != 2 || cs.Received.Response != 1 || cs.Received.Error != 1 || cs.Asks.OK != 1 {
		t.Errorf("asker stats: sent %+v received %+v asks %+v", cs.Sent, cs.Received, cs.Asks)
	}
}

// TestEnvelopeVersionsMix: a node of either envelope understands the other's tells,
// asks, answers and errors, with the sender read from the subject as always.
func TestEnvelopeVersionsMix(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	versions := []bus.EnvelopeVersion{bus.Envelope1, bus.Envelope2}
	for _, from := range versions {
		for _, to := range versions {
			t.Run(fmtVersions(from, to), func(t *testing.T) {
				id := fmtVersions(from, to)
				c := connect(t, s.url, coordinator("c-"+id), bus.WithEnvelope(from))
				w := connect(t, s.url, worker("w-"+id), bus.WithEnvelope(to))
				type note struct {
					N int `json:"n"`
				}
				tells := make(chan bus.Address, 1)
				must(t, bus.Handle(w, "note", func(_ context.Context, f bus.Address, n note) (struct{}, error) {
					if n.N == 7 {
						tells <- f
					}
					return struct{}{}, nil
				}))
				whoAmI(t, w, "who")
				must(t, w.Handle("fail", func(context.Context, *bus.Request) (any, error) {
					return nil, bus.WithCode(bus.CodeForbidden, errors.New("not yours"))
				}))
				must(t, c.Tell(context.Background(), w.Self(), "note", note{N: 7}))
				if f := recv(t, "tell", tells); f != c.Self() {
					t.Fatalf("tell from %v, want %v", f, c.Self())
				}
				e, err := bus.Ask[echo](context.Background(), c, w.Self(), "who", struct{}{})
				if err != nil || e.From != c.Self().String() || e.Me != w.Self().String() {
					t.Fatalf("ask = %+v, %v", e, err)
				}
				var re *bus.RemoteError
				if _, err := bus.Ask[[]byte](context.Background(), c, w.Self(), "fail", nil); !errors.As(err, &re) ||
					!errors.Is(err, bus.CodeForbidden) || re.Message != "not yours" {
					t.Fatalf("ask fail = %v, want a RemoteError 403 'not yours'", err)
				}
				if cs := c.Stats(); cs.Received.Response != 1 || cs.Received.Error != 1 {
					t.Errorf("asker received %+v, want 1 response and 1 error", cs.Received)
				}
			})
		}
	}
}

func fmtVersions(from, to bus.EnvelopeVersion) string {
	return "v" + string(rune('0'+from)) + "-to-v" + string(rune('0'+to))
}

func TestEnvelopeVersionRefused(t *testing.T) {
	t.Parallel()
	s := startServer(t, -1)
	if _, err := bus.New(dial(t, s.url), worker("w"), bus.WithEnvelope(3)); err == nil {
		t.Fatal("envelope version 3 accepted")
	}
}
