package bridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/mu"
	"github.com/jobbus/jobbus/internal/munode"
)

// withMu turns the Mu port on, on a random port.
func withMu(f func(*bridgeConfig)) option {
	return withBridge(func(c *bridgeConfig) {
		c.MuListen = "127.0.0.1:0"
		if f != nil {
			f(c)
		}
	})
}

// muNode registers a reference Mu node of address addr on the bridge's Mu port; it
// echoes asks on "echo".
func (s *system) muNode(addr string) *munode.Node {
	s.t.Helper()
	a, err := mu.ParseAddress(addr)
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	n, err := munode.Dial(ctx, s.br.MuAddr().String(), a, munode.Options{Timeout: waitFor, Heartbeat: time.Second})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = n.Close() })
	n.Handle("echo", munode.Echo)
	return n
}

// nativeNode is a bus node on NATS, as any native jobbus peer is; it echoes asks on
// "echo".
func (s *system) nativeNode(id string) *bus.Node {
	s.t.Helper()
	n, err := bus.New(s.NC, bus.Address{Role: "native", ID: id}, bus.WithAskTimeout(waitFor))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = n.Close() })
	if err := n.Handle("echo", func(_ context.Context, r *bus.Request) (any, error) { return json.RawMessage(r.Data), nil }); err != nil {
		s.t.Fatal(err)
	}
	return n
}

func muAddr(addr string) bus.Address { return bus.Address{Role: bus.RoleMu, ID: addr} }

// askCtx bounds a test's asks: all of them, so longer than one wait.
func askCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitFor)
	t.Cleanup(cancel)
	return ctx
}

// TestMuAsksBothWays: a Mu node over TCP and native bus nodes ask and tell each other
// both ways, and Mu nodes each other through the bus; errors come back as ERRORs.
func TestMuAsksBothWays(t *testing.T) {
	t.Parallel()
	s := setup(t, noCoordinator(), withMu(nil))
	m1, m2 := s.muNode("127.0.0.1:27001"), s.muNode("127.0.0.1:27002")
	native := s.nativeNode("n1")
	from := make(chan bus.Address, 1)
	if err := native.Handle("whoami", func(_ context.Context, r *bus.Request) (any, error) {
		from <- r.From
		return r.From.String(), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := native.Handle("fail", func(context.Context, *bus.Request) (any, error) {
		return nil, errors.New("native says no")
	}); err != nil {
		t.Fatal(err)
	}
	m1.Handle("fail", func(context.Context, *mu.Message) (json.RawMessage, error) { return nil, errors.New("mu says no") })
	ctx := askCtx(t)

	t.Run("MuToNative", func(t *testing.T) {
		got, err := m1.Ask(ctx, "echo@native/n1", json.RawMessage(`{"x":[1,"two"]}`))
		if err != nil || string(got) != `{"x":[1,"two"]}` {
			t.Fatalf("got %s, %v", got, err)
		}
		if _, err := m1.Ask(ctx, "whoami@native/n1", nil); err != nil {
			t.Fatal(err)
		}
		if f := <-from; f != muAddr("127.0.0.1:27001") {
			t.Fatalf("native saw the ask from %v", f)
		}
		// Any node of the role.
		if got, err := m1.Ask(ctx, "echo@native", json.RawMessage(`7`)); err == nil || got != nil {
			// native/n1 serves only its own subject: nobody serves the role's.
			t.Fatalf("role-wide ask: got %s, %v; want no peer", got, err)
		}
	})
	t.Run("NativeToMu", func(t *testing.T) {
		got, err := bus.Ask[json.RawMessage](ctx, native, muAddr("127.0.0.1:27001"), "echo", json.RawMessage(`{"y":2}`))
		if err != nil || string(got) != `{"y":2}` {
			t.Fatalf("got %s, %v", got, err)
		}
	})
	t.Run("MuToMu", func(t *testing.T) {
		got, err := m1.Ask(ctx, "echo@127.0.0.1:27002", json.RawMessage(`"hello"`))
		if err != nil || string(got) != `"hello"` {
			t.Fatalf("got %s, %v", got, err)
		}
		// The receiver reads who asked in senderAddress, and can answer the same way.
		seen := make(chan *mu.Address, 1)
		m2.Handle("who", func(_ context.Context, m *mu.Message) (json.RawMessage, error) {
			seen <- m.SenderAddress
			return nil, nil
		})
		if _, err := m1.Ask(ctx, "who@127.0.0.1:27002", nil); err != nil {
			t.Fatal(err)
		}
		if a := <-seen; a == nil || *a != (mu.Address{Host: "127.0.0.1", Port: 27001}) {
			t.Fatalf("senderAddress %+v", a)
		}
	})
	t.Run("Errors", func(t *testing.T) {
		_, err := m1.Ask(ctx, "fail@native/n1", nil)
		if !errors.Is(err, munode.ErrRemote) || err.Error() != "native says no" {
			t.Fatalf("mu asking a failing native handler: %v", err)
		}
		_, err = bus.Ask[json.RawMessage](ctx, native, muAddr("127.0.0.1:27001"), "fail", nil)
		if !errors.Is(err, bus.ErrRemote) || !strings.Contains(err.Error(), "mu says no") {
			t.Fatalf("native asking a failing mu handler: %v", err)
		}
		_, err = bus.Ask[json.RawMessage](ctx, native, muAddr("127.0.0.1:27001"), "nothing.here", nil)
		if !errors.Is(err, bus.ErrRemote) || !strings.Contains(err.Error(), "no handler") {
			t.Fatalf("native asking a path the mu node does not serve: %v", err)
		}
		_, err = m1.Ask(ctx, "echo@native/nobody", nil)
		if !errors.Is(err, munode.ErrRemote) || !strings.Contains(err.Error(), "no peer") {
			t.Fatalf("mu asking nobody: %v", err)
		}
		_, err = bus.Ask[json.RawMessage](ctx, native, muAddr("127.0.0.1:1"), "echo", nil)
		if !errors.Is(err, bus.ErrNoPeer) {
			t.Fatalf("native asking an unregistered mu address: %v", err)
		}
		_, err = m1.Ask(ctx, "echo", nil)
		if !errors.Is(err, munode.ErrRemote) || !strings.Contains(err.Error(), "names no destination") {
			t.Fatalf("mu asking without a destination: %v", err)
		}
	})
	t.Run("AskerTimeoutBounded", func(t *testing.T) {
		// A native handler that never answers: the Mu node still gets its one ERROR,
		// within the bridge's request timeout (2s here).
		release := make(chan struct{})
		defer close(release)
		if err := native.Handle("stall", func(context.Context, *bus.Request) (any, error) {
			<-release
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := m1.Ask(ctx, "stall@native/n1", nil)
		if !errors.Is(err, munode.ErrRemote) || !strings.Contains(err.Error(), "timeout") {
			t.Fatalf("stalled ask: %v", err)
		}
		if took := time.Since(start); took > waitFor {
			t.Fatalf("the ERROR took %v", took)
		}
	})
	t.Run("Tells", func(t *testing.T) {
		got := make(chan string, 2)
		if err := native.Handle("note", func(_ context.Context, r *bus.Request) (any, error) {
			got <- string(r.Data)
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		m2.Handle("note", func(_ context.Context, m *mu.Message) (json.RawMessage, error) {
			got <- string(m.Payload)
			return nil, nil
		})
		if err := m1.Tell("note@native/n1", json.RawMessage(`{"to":"native"}`)); err != nil {
			t.Fatal(err)
		}
		if err := native.Tell(ctx, muAddr("127.0.0.1:27002"), "note", json.RawMessage(`{"to":"mu"}`)); err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{`{"to":"native"}`: true, `{"to":"mu"}`: true}
		for range 2 {
			select {
			case g := <-got:
				if !want[g] {
					t.Fatalf("tell delivered %s", g)
				}
				delete(want, g)
			case <-ctx.Done():
				t.Fatalf("tells not delivered: %v", want)
			}
		}
	})
}

// TestMuSubmitsAndReadsStatus: the client API answers a Mu node, registered or not,
// with the client port's replies as RESPONSE payloads.
func TestMuSubmitsAndReadsStatus(t *testing.T) {
	t.Parallel()
	s := setup(t, withMu(nil))
	s.specWorker("mu-api-worker", 2)
	ctx := askCtx(t)
	n := s.muNode("10.0.0.7:27777")

	reply, err := n.Ask(ctx, "jobbus.api.submit", json.RawMessage(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"mu"},"maxAttempts":1}`))
	if err != nil {
		t.Fatal(err)
	}
	sub, ok := decodeReply(t, reply).(*protocol.JobSubmitted)
	if !ok {
		t.Fatalf("submit answered %s", reply)
	}
	testkitEventually(t, "the job completes, as a Mu node reads it", func() bool {
		reply, err := n.Ask(ctx, "jobbus.api.status", json.RawMessage(`{"type":"GET_JOB_STATUS","jobId":"`+sub.JobID+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		st, ok := decodeReply(t, reply).(*protocol.JobStatus)
		if !ok {
			t.Fatalf("status answered %s", reply)
		}
		return st.Job.State == protocol.StateCompleted
	})
	// The spec's ERROR is a reply like any other: a RESPONSE.
	reply, err = n.Ask(ctx, "jobbus.api.status", json.RawMessage(`{"type":"GET_JOB_STATUS","jobId":"nope"}`))
	if e, ok := decodeReply(t, reply).(*protocol.Error); err != nil || !ok || e.Message != "Unknown job: nope" {
		t.Fatalf("unknown job: %s, %v", reply, err)
	}
	// A request on the wrong endpoint, or not a request, is the Mu node's mistake: ERROR.
	if _, err := n.Ask(ctx, "jobbus.api.submit", json.RawMessage(`{"type":"LIST_WORKERS"}`)); !errors.Is(err, munode.ErrRemote) {
		t.Fatalf("wrong endpoint: %v", err)
	}
	if _, err := n.Ask(ctx, "jobbus.api.list", json.RawMessage(`{"type":"LIST_JOBS","limit":"x"}`)); err == nil || !strings.HasPrefix(err.Error(), "Malformed request: ") {
		t.Fatalf("malformed request: %v", err)
	}

	// Unregistered: raw frames on a connection that never sent a HEARTBEAT.
	p := dial(t, s.br.MuAddr())
	sendMu(t, p, `{"messageType":"ASK","requestId":"r1","path":"jobbus.api.status","payload":{"type":"GET_JOB_STATUS","jobId":"`+sub.JobID+`"}}`)
	a := recvMu(t, p)
	if a.MessageType != mu.TypeResponse || a.RequestID != "r1" {
		t.Fatalf("unregistered status: %+v", a)
	}
	if st, ok := decodeReply(t, a.Payload).(*protocol.JobStatus); !ok || st.Job.State != protocol.StateCompleted {
		t.Fatalf("unregistered status payload %s", a.Payload)
	}
	// But the bus is for registered nodes.
	sendMu(t, p, `{"messageType":"ASK","requestId":"r2","path":"echo@native/n1"}`)
	if a := recvMu(t, p); a.MessageType != mu.TypeError || a.RequestID != "r2" || !strings.HasPrefix(a.ErrorMessage, "not registered") {
		t.Fatalf("unregistered bus ask: %+v", a)
	}
}

func decodeReply(t *testing.T, b []byte) protocol.Message {
	t.Helper()
	m, err := protocol.Decode(b)
	if err != nil {
		t.Fatalf("reply %s: %v", b, err)
	}
	return m
}

func testkitEventually(t *testing.T, what string, cond func() bool) { eventually(t, what, cond) }

func sendMu(t *testing.T, p *peer, js string) {
	t.Helper()
	if err := p.SendPayload([]byte(js)); err != nil {
		t.Fatal(err)
	}
}

func recvMu(t *testing.T, p *peer) *mu.Message {
	t.Helper()
	b, err := p.RecvRaw()
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	m, err := mu.Decode(b)
	if err != nil {
		t.Fatalf("bridge wrote %q: %v", b, err)
	}
	return m
}

// TestMuFailFast: asks waiting for a Mu node fail as soon as its connection drops, long
// before any timeout, and later ones find no peer.
func TestMuFailFast(t *testing.T) {
	t.Parallel()
	s := setup(t, noCoordinator(), withMu(func(c *bridgeConfig) { c.RequestTimeout = time.Minute }))
	n := s.muNode("127.0.0.1:27010")
	native := s.nativeNode("asker")
	var asked atomic.Int32
	n.Handle("hang", func(ctx context.Context, _ *mu.Message) (json.RawMessage, error) {
		asked.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const asks = 5
	errs := make(chan error, asks)
	for range asks {
		go func() {
			_, err := bus.Ask[json.RawMessage](ctx, native, muAddr("127.0.0.1:27010"), "hang", nil)
			errs <- err
		}()
	}
	eventually(t, "the asks reach the Mu node", func() bool { return asked.Load() == asks })
	// The node's side drops the connection without a word: no RESPONSE, no ERROR.
	start := time.Now()
	_ = n.Close()
	for range asks {
		err := <-errs
		if !errors.Is(err, bus.CodeUnavailable) || !strings.Contains(err.Error(), "disconnected") {
			t.Fatalf("pending ask ended with %v, want the node's disconnection", err)
		}
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("pending asks failed after %v", took)
	}
	eventually(t, "the node is gone from the bus", func() bool {
		_, err := bus.Ask[json.RawMessage](ctx, native, muAddr("127.0.0.1:27010"), "hang", nil)
		return errors.Is(err, bus.ErrNoPeer)
	})
}

// TestMuSupersede: a second connection registering a live address takes it over; the
// first is told why and closed, and stops being served.
func TestMuSupersede(t *testing.T) {
	t.Parallel()
	s := setup(t, noCoordinator(), withMu(nil))
	first := dial(t, s.br.MuAddr())
	sendMu(t, first, `{"messageType":"HEARTBEAT","requestId":"reg","senderAddress":{"host":"127.0.0.1","port":27020}}`)
	if a := recvMu(t, first); a.MessageType != mu.TypeResponse || string(a.Payload) != `"mu/~MTI3LjAuMC4xOjI3MDIw"` {
		t.Fatalf("registration: %+v", a)
	}
	second := s.muNode("127.0.0.1:27020")
	second.Handle("which", func(context.Context, *mu.Message) (json.RawMessage, error) { return json.RawMessage(`"second"`), nil })
	if a := recvMu(t, first); a.MessageType != mu.TypeError || !strings.HasPrefix(a.ErrorMessage, "superseded") {
		t.Fatalf("the first connection got %+v", a)
	}
	if more := first.ExpectClosed(); len(more) > 0 {
		t.Fatalf("frames after the ERROR: %q", more)
	}
	native := s.nativeNode("n")
	got, err := bus.Ask[string](askCtx(t), native, muAddr("127.0.0.1:27020"), "which", nil)
	if err != nil || got != "second" {
		t.Fatalf("got %q, %v", got, err)
	}
}

// TestMuIdle: a connection that sends nothing is closed after the idle timeout, with
// an ERROR saying so.
func TestMuIdle(t *testing.T) {
	t.Parallel()
	s := setup(t, noCoordinator(), withMu(func(c *bridgeConfig) { c.MuIdleTimeout = 300 * time.Millisecond }))
	p := dial(t, s.br.MuAddr())
	sendMu(t, p, `{"messageType":"HEARTBEAT","senderAddress":{"host":"idle","port":1}}`)
	a := recvMu(t, p)
	if a.MessageType != mu.TypeError || !strings.HasPrefix(a.ErrorMessage, "no message within 300ms") {
		t.Fatalf("got %+v", a)
	}
	if more := p.ExpectClosed(); len(more) > 0 {
		t.Fatalf("frames after the idle ERROR: %q", more)
	}
}

// muHostile is one hostile input on the Mu port: the start of the ERROR's text it gets
// ("" for none) and whether the connection then closes.
type muHostile struct {
	name   string
	send   []byte
	want   string
	closes bool
}

func muHostileInputs() []muHostile {
	f := func(s string) []byte { return framed(s) }
	const malformed = "Malformed request: "
	oneMiB := 1 << 20
	return []muHostile{
		{"Length0", header(0), malformed + "frame: length must be positive", true},
		{"LengthMinus1", header(0xFFFFFFFF), malformed + "frame: length must be positive", true},
		{"Length2^31-1", append(header(1<<31-1), "{}"...), malformed + "frame: payload too large", true},
		{"Length1MiB+1", append(header(uint32(oneMiB+1)), make([]byte, 4096)...), malformed + "frame: payload too large", true},
		{"NotJSON", f(`hello`), malformed, true},
		{"NotAnObject", f(`["ASK"]`), malformed, true},
		{"Null", f(`null`), malformed, true},
		{"TrailingBytes", f(`{"messageType":"TELL"} {}`), malformed, true},
		{"NoMessageType", f(`{"path":"x"}`), malformed + "mu: malformed message: no messageType", true},
		{"UnknownMessageType", f(`{"messageType":"SHOUT"}`), malformed + "mu: malformed message: unknown messageType", true},
		{"MessageTypeNumber", f(`{"messageType":3}`), malformed, true},
		{"WrongCaseField", f(`{"messageType":"TELL","Path":"x@native/n"}`), malformed, true},
		{"PortOutOfRange", f(`{"messageType":"HEARTBEAT","senderAddress":{"host":"h","port":70000}}`), malformed, true},
		{"PortAsString", f(`{"messageType":"HEARTBEAT","senderAddress":{"host":"h","port":"1"}}`), malformed, true},
		{"AddressNotObject", f(`{"messageType":"HEARTBEAT","senderAddress":"h:1"}`), malformed, true},
		{"Nesting10000", f(`{"messageType":"TELL","payload":` + deep(10_000) + `}`), malformed, true},
		{"NULRaw", f("{\"messageType\":\"TELL\",\"path\":\"a\x00b\"}"), malformed, true},
		{"InvalidUTF8", f("{\"messageType\":\"ASK\",\"requestId\":\"\xff\",\"path\":\"jobbus.api.list\"}"), "jobbus.api.list takes", false},
		{"HugeHost", f(`{"messageType":"HEARTBEAT","senderAddress":{"host":"` + strings.Repeat("h", 300) + `","port":1}}`), malformed, true},
		// Well-formed, but not something the bridge can act on: ERROR, and it stays.
		{"AskWithoutRequestId", f(`{"messageType":"ASK","path":"echo@native/n"}`), "an ASK needs a requestId", false},
		{"AskWithoutDestination", f(`{"messageType":"ASK","requestId":"1","path":"echo"}`), "not registered", false},
		{"TellToAPI", f(`{"messageType":"TELL","path":"jobbus.api.submit","payload":{}}`), "jobbus.api.submit takes an ASK", false},
		{"APIWithoutPayload", f(`{"messageType":"ASK","requestId":"1","path":"jobbus.api.submit"}`), "jobbus.api.submit takes the client port's request", false},
		{"APIMalformedPayload", f(`{"messageType":"ASK","requestId":"1","path":"jobbus.api.submit","payload":[1]}`), malformed, false},
		{"EmptyHost", f(`{"messageType":"HEARTBEAT","senderAddress":{"host":"","port":1}}`), "senderAddress needs a host", false},
		{"ResponseNobodyAwaits", f(`{"messageType":"RESPONSE","requestId":"made-up"}`), "", false},
		// A stalled half frame: closed without a word after the stall timeout.
		{"StalledHalfFrame", append(header(100), `{"messageType":"TE`...), "", true},
		{"StalledHeader", []byte{0, 0}, "", true},
	}
}

// TestMuHostileInputs: every hostile input gets an ERROR or a close and costs only its
// own connection: a registered Mu node keeps answering asks all along.
func TestMuHostileInputs(t *testing.T) {
	t.Parallel()
	s := setup(t, noCoordinator(), withMu(func(c *bridgeConfig) {
		c.FrameStallTimeout = time.Second
		c.WriteTimeout = 500 * time.Millisecond
	}))
	s.muNode("127.0.0.1:27030")
	native := s.nativeNode("prober")
	probe := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		got, err := bus.Ask[json.RawMessage](ctx, native, muAddr("127.0.0.1:27030"), "echo", json.RawMessage(`1`))
		if err != nil || string(got) != "1" {
			t.Fatalf("the healthy Mu node: %s, %v", got, err)
		}
	}
	probe()
	t.Run("table", func(t *testing.T) {
		for _, h := range muHostileInputs() {
			t.Run(h.name, func(t *testing.T) {
				t.Parallel()
				p := dial(t, s.br.MuAddr())
				wrote := make(chan error, 1)
				go func() { wrote <- p.Write(h.send) }()
				defer func() { <-wrote }()
				if h.want != "" {
					a := recvMu(t, p)
					if a.MessageType != mu.TypeError || !strings.HasPrefix(a.ErrorMessage, h.want) {
						t.Fatalf("got %+v, want ERROR %q", a, h.want)
					}
				}
				if h.closes {
					if more := p.ExpectClosed(); len(more) > 0 {
						t.Fatalf("frames after the ERROR: %q", more)
					}
					return
				}
				// The connection lives on and is served.
				sendMu(t, p, `{"messageType":"HEARTBEAT","requestId":"still-there"}`)
				if a := recvMu(t, p); a.MessageType != mu.TypeResponse || a.RequestID != "still-there" {
					t.Fatalf("after the hostile input: %+v", a)
				}
			})
		}
	})
	probe()
	st := s.br.Stats().Ports["mu"]
	t.Logf("mu port: %+v", st)
	if st.FrameErrors["malformed"] == 0 || st.FrameErrors["bad_length"] == 0 {
		t.Errorf("frame errors not counted: %+v", st)
	}
}

// TestMuClientBatchSettled: a Mu node's own SUBMIT_JOBS is answered as the client
// port's is: a submission whose answer leaves its outcome open is sent once more alone
// and its answer takes the open one's place.
func TestMuClientBatchSettled(t *testing.T) {
	t.Parallel()
	s := setup(t, noCoordinator(), withMu(nil))
	notServing := `{"type":"ERROR","message":"` + protocol.NotServingPrefix + `: its lease lapsed"}`
	_, again := standInMany(t, s.NC, func([]string) string {
		return `{"type":"JOBS_SUBMITTED","answers":[{"type":"JOB_SUBMITTED","jobId":"` + protocol.RequestJobID("r0") + `"},` + notServing + `]}`
	})
	submit := json.RawMessage(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"}}`)
	payload, err := protocol.Encode(&protocol.SubmitJobs{Jobs: []protocol.BatchedSubmission{
		{RequestID: "r0", Submit: submit}, {RequestID: "r1", Submit: submit},
	}})
	if err != nil {
		t.Fatal(err)
	}
	p := dial(t, s.br.MuAddr())
	sendMu(t, p, `{"messageType":"ASK","requestId":"b","path":"`+submitManySubject+`","payload":`+string(payload)+`}`)
	a := recvMu(t, p)
	got, ok := decodeReply(t, a.Payload).(*protocol.JobsSubmitted)
	if a.MessageType != mu.TypeResponse || !ok || len(got.Answers) != 2 {
		t.Fatalf("reply %+v, want a RESPONSE of a JOBS_SUBMITTED of 2 answers", a)
	}
	for i, rid := range []string{"r0", "r1"} {
		if want := `{"type":"JOB_SUBMITTED","jobId":"` + protocol.RequestJobID(rid) + `"}`; string(got.Answers[i]) != want {
			t.Fatalf("answer %d %s, want %s", i, got.Answers[i], want)
		}
	}
	if len(again) != 1 {
		t.Fatalf("%d batches sent again, want 1", len(again))
	}
}

// TestMuSenderAddressIPv6: a Mu node with an IPv6 host reaches another as its own
// senderAddress, host and port apart, so that the other can answer it.
func TestMuSenderAddressIPv6(t *testing.T) {
	t.Parallel()
	s := setup(t, noCoordinator(), withMu(nil))
	v6, v4 := s.muNode("[::1]:27041"), s.muNode("127.0.0.1:27042")
	seen := make(chan *mu.Address, 1)
	v4.Handle("who", func(_ context.Context, m *mu.Message) (json.RawMessage, error) {
		seen <- m.SenderAddress
		return nil, nil
	})
	ctx := askCtx(t)
	if _, err := v6.Ask(ctx, "who@127.0.0.1:27042", nil); err != nil {
		t.Fatal(err)
	}
	a := <-seen
	if a == nil || *a != (mu.Address{Host: "::1", Port: 27041}) {
		t.Fatalf("senderAddress %+v, want ::1 and 27041", a)
	}
	// Answered the way the doc says: "<path>@<host>:<port>".
	if got, err := v4.Ask(ctx, "echo@"+a.Host+":"+strconv.Itoa(a.Port), json.RawMessage(`1`)); err != nil || string(got) != "1" {
		t.Fatalf("asking the sender back: %s, %v", got, err)
	}
}

// TestMuAsksAskingTheNodeBack: a Mu node with all of its connection's ask slots taken
// by asks whose handlers ask it back still has its answers read: the asks beyond the
// bound get an ERROR at once instead of stopping the reading, and every ask ends well
// within the request timeout.
func TestMuAsksAskingTheNodeBack(t *testing.T) {
	t.Parallel()
	const slots = 4
	s := setup(t, noCoordinator(), withMu(func(c *bridgeConfig) {
		c.MaxInFlight = slots
		c.RequestTimeout = waitFor // a stall would last this long
	}))
	m := s.muNode("127.0.0.1:27010")
	native := s.nativeNode("n1")
	if err := native.Handle("ping", func(ctx context.Context, r *bus.Request) (any, error) {
		// Ask the Mu node back: its answer comes on the same connection as its asks.
		return bus.Ask[json.RawMessage](ctx, native, muAddr("127.0.0.1:27010"), "echo", json.RawMessage(r.Data))
	}); err != nil {
		t.Fatal(err)
	}
	ctx := askCtx(t)
	const asks = 3 * slots
	type result struct {
		i   int
		got json.RawMessage
		err error
	}
	results := make(chan result, asks)
	start := time.Now()
	for i := range asks {
		go func() {
			got, err := m.Ask(ctx, "ping@native/n1", json.RawMessage(strconv.Itoa(i)))
			results <- result{i, got, err}
		}()
	}
	answered := 0
	for range asks {
		select {
		case r := <-results:
			switch {
			case r.err == nil && string(r.got) == strconv.Itoa(r.i):
				answered++
			case r.err == nil:
				t.Fatalf("ask %d answered %s", r.i, r.got)
			case !errors.Is(r.err, munode.ErrRemote) || !strings.Contains(r.err.Error(), "in flight"):
				t.Fatalf("ask %d: %v, want its answer or an ERROR for too many asks in flight", r.i, r.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("asks whose handlers ask the Mu node back still wait after %v", time.Since(start))
		}
	}
	if answered < slots {
		t.Fatalf("%d asks answered, want at least the %d the connection may have in flight", answered, slots)
	}
	// The connection is still a working peer.
	if got, err := m.Ask(ctx, "ping@native/n1", json.RawMessage(`"again"`)); err != nil || string(got) != `"again"` {
		t.Fatalf("ask after the flood: %s, %v", got, err)
	}
}
