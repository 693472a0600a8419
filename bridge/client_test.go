package bridge_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
)

func TestClientPort(t *testing.T) {
	t.Parallel()

	t.Run("RepliesAreTheCoordinatorsBytes", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		c := s.client()
		w := s.specWorker("w-1", 2)
		key := "key-1"
		submit := &protocol.SubmitJob{TaskType: "SHA256", Payload: []byte(`{"text":"abc"}`), IdempotencyKey: &key}
		js, ok := c.Request(submit).(*protocol.JobSubmitted)
		if !ok {
			t.Fatal("SUBMIT_JOB not answered with JOB_SUBMITTED")
		}
		s.waitState(js.JobID, protocol.StateCompleted)
		w.Stop() // a live worker's heartbeats would make WORKER_LIST differ between two calls
		eventually(t, "worker gone", func() bool { return !s.hasWorker("w-1") })

		// Every request on one connection; each reply must be byte-identical to what
		// the coordinator answers natively to the same body.
		for _, req := range []protocol.Message{
			submit, // a duplicate: the same JOB_SUBMITTED
			&protocol.GetJobStatus{JobID: js.JobID},
			&protocol.ListJobs{},
			&protocol.ListWorkers{},
			&protocol.CancelJob{JobID: js.JobID}, // terminal: cancelled=false
			&protocol.GetJobStatus{JobID: "nope"},
			&protocol.CancelJob{JobID: "nope"},
			&protocol.SubmitJob{TaskType: "SLEEP", Payload: []byte(`{"durationMillis":-1}`)},
		} {
			body, err := protocol.Encode(req)
			if err != nil {
				t.Fatal(err)
			}
			want, err := s.native.DoRaw(context.Background(), req.MessageType(), body)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.SendPayload(body); err != nil {
				t.Fatal(err)
			}
			got, err := c.RecvRaw()
			if err != nil {
				t.Fatalf("%s: %v", req.MessageType(), err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s: bridge replied\n%s\nnatively\n%s", req.MessageType(), got, want)
			}
		}
	})

	t.Run("ManyRequestsOnOneConnection", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		c := s.client()
		ids := map[string]bool{}
		for i := range 200 {
			ids[c.Submit("WORD_COUNT", fmt.Sprintf(`{"text":"%d words here"}`, i))] = true
		}
		if len(ids) != 200 {
			t.Fatalf("%d distinct job ids, want 200", len(ids))
		}
		list, ok := c.Request(&protocol.ListJobs{}).(*protocol.JobList)
		if !ok || len(list.Jobs) != 200 {
			t.Fatalf("JOB_LIST has %d jobs, want 200", len(list.Jobs))
		}
	})

	t.Run("InvalidPayloadKeepsTheConnection", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		c := s.client()
		c.MustSend(&protocol.SubmitJob{TaskType: "SLEEP", Payload: []byte(`{"durationMillis":"soon"}`)})
		c.ExpectError("Invalid payload: ")
		c.MustSend(&protocol.GetJobStatus{JobID: "missing"})
		c.ExpectError("Unknown job: missing")
		if _, ok := c.Request(&protocol.ListWorkers{}).(*protocol.WorkerList); !ok {
			t.Fatal("connection unusable after an ERROR")
		}
	})

	t.Run("WorkerMessageIsAnsweredAndKeepsTheConnection", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		c := s.client()
		for _, m := range []protocol.Message{
			&protocol.Heartbeat{WorkerID: "w"},
			&protocol.WorkerRegister{WorkerID: "w", Capacity: 1},
			&protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Success: true},
			&protocol.JobSubmitted{JobID: "j"}, // a reply type, not a request
		} {
			c.MustSend(m)
			c.ExpectError(protocol.UnexpectedType(m.MessageType(), "client").Message)
		}
		if _, ok := c.Request(&protocol.ListJobs{}).(*protocol.JobList); !ok {
			t.Fatal("connection unusable after an unexpected message")
		}
	})

	t.Run("MalformedFrameGetsErrorThenClose", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		for name, payload := range map[string]string{
			"NonJSON":         `hello`,
			"UnknownType":     `{"type":"DELETE_EVERYTHING"}`,
			"MissingType":     `{"jobId":"x"}`,
			"WrongFieldTypes": `{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":1},"maxAttempts":"3"}`,
			"NotAnObject":     `[1,2,3]`,
		} {
			t.Run(name, func(t *testing.T) {
				c := s.client()
				if err := c.SendPayload([]byte(payload)); err != nil {
					t.Fatal(err)
				}
				c.ExpectErrorThenClosed("Malformed request: ")
			})
		}
	})

	t.Run("RequestWaitsForACoordinatorToServe", func(t *testing.T) {
		t.Parallel()
		s := setup(t, noCoordinator(), withBridge(func(c *bridgeConfig) { c.RequestTimeout = time.Minute }))
		c := s.client()
		c.MustSend(&protocol.GetJobStatus{JobID: "x"})
		s.StartCoordinator(t) // while the request waits
		c.ExpectError("Unknown job: x")
	})

	t.Run("NoCoordinatorIsAnErrorAndKeepsTheConnection", func(t *testing.T) {
		t.Parallel()
		s := setup(t, noCoordinator(), withBridge(func(c *bridgeConfig) { c.RequestTimeout = 200 * time.Millisecond }))
		c := s.client()
		for range 2 {
			c.MustSend(&protocol.GetJobStatus{JobID: "x"})
			c.ExpectError("coordinator unavailable: no coordinator is serving jobbus.api.status")
		}
		s.StartCoordinator(t)
		c.MustSend(&protocol.GetJobStatus{JobID: "x"})
		c.ExpectError("Unknown job: x") // the same connection, now answered
	})
}

// TestClientPortOversizedReply plays a misbehaving coordinator on a NATS server whose
// max payload exceeds a frame: the bridge must answer ERROR rather than write a reply
// larger than a frame, and keep the connection.
func TestClientPortOversizedReply(t *testing.T) {
	t.Parallel()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, MaxPayload: 4 << 20, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(waitFor) {
		t.Fatal("nats server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	prefix := `{"type":"JOB_LIST","jobs":[],"pad":"`
	bodies := map[string][]byte{
		"status":  bytes.Repeat([]byte("x"), frame.MaxSize+1),
		"list":    []byte(prefix + strings.Repeat("y", frame.MaxSize-len(prefix)-2) + `"}`),
		"workers": nil,
	}
	for name, body := range bodies {
		if _, err := nc.Subscribe(protocol.APIPrefix+"."+name, func(m *nats.Msg) { _ = m.Respond(body) }); err != nil {
			t.Fatal(err)
		}
	}
	if len(bodies["list"]) != frame.MaxSize {
		t.Fatalf("list body is %d bytes, want exactly %d", len(bodies["list"]), frame.MaxSize)
	}
	br := startBridge(t, nc, fastBridge())
	c := dial(t, br.ClientAddr())

	c.MustSend(&protocol.GetJobStatus{JobID: "x"})
	c.ExpectError(fmt.Sprintf("reply of %d bytes exceeds the %d-byte frame limit", frame.MaxSize+1, frame.MaxSize))
	c.MustSend(&protocol.ListJobs{})
	if got, err := c.RecvRaw(); err != nil || !bytes.Equal(got, bodies["list"]) {
		t.Fatalf("a reply of exactly %d bytes must pass unchanged (err %v, %d bytes)", frame.MaxSize, err, len(got))
	}
	c.MustSend(&protocol.ListWorkers{})
	c.ExpectError("coordinator error: empty reply")
}

func TestClientPortRequestTimeout(t *testing.T) {
	t.Parallel()
	s := setup(t, noCoordinator(), withBridge(func(c *bridgeConfig) { c.RequestTimeout = 100 * time.Millisecond }))
	// A responder that never answers: the request times out.
	if _, err := s.NC.Subscribe(protocol.APIPrefix+".status", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	c := s.client()
	c.MustSend(&protocol.GetJobStatus{JobID: "x"})
	c.ExpectError("coordinator unavailable: no reply within 100ms")
	c.MustSend(&protocol.ListJobs{})
	c.ExpectError("coordinator unavailable: ")
	if m, ok := c.Request(&protocol.Heartbeat{WorkerID: "w"}).(*protocol.Error); !ok || !strings.Contains(m.Message, "HEARTBEAT") {
		t.Fatalf("connection unusable after timeouts: %v", m)
	}

	// A submission or a cancel that went unanswered may have been acted on: its ERROR
	// says so, never what would mean "nothing stored". A submission's names the job its
	// request id would have created.
	var mu sync.Mutex
	var rid string
	for _, tc := range []struct {
		endpoint string
		req      protocol.Message
		what     string
		job      func() string
	}{
		{"submit", &protocol.SubmitJob{TaskType: "SHA256", Payload: []byte(`{"text":"x"}`)}, "submission", func() string {
			mu.Lock()
			defer mu.Unlock()
			return "job " + protocol.RequestJobID(rid) + ": "
		}},
		{"cancel", &protocol.CancelJob{JobID: "x"}, "cancel", func() string { return "" }},
	} {
		if _, err := s.NC.Subscribe(protocol.APIPrefix+"."+tc.endpoint, func(m *nats.Msg) {
			if m.Header.Get(protocol.HeaderTimeout) == "" {
				t.Errorf("%s forwarded without %s", tc.endpoint, protocol.HeaderTimeout)
			}
			mu.Lock()
			rid = m.Header.Get(protocol.HeaderRequestID)
			mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
		c.MustSend(tc.req)
		m, ok := c.MustRecv().(*protocol.Error)
		if want := protocol.OutcomeUnknownPrefix + tc.job() + "the " + tc.what + " may or may not be stored (no reply from the coordinator within 100ms); "; !ok || !strings.HasPrefix(m.Message, want) {
			t.Fatalf("%s unanswered: %+v, want an ERROR starting %q", tc.endpoint, m, want)
		}
	}
}

// TestClientPortSubmissionFillingAFrame: a SUBMIT_JOB the size of a whole frame, which
// the bridge cannot forward over NATS as it is (its headers take it past NATS's 1 MiB),
// is answered as surely refused, never as "Outcome unknown": nothing was sent, so
// nothing was stored. A SHA256 text of some 174,000 escaped characters (within its 200,000)
// gets the coordinator's own answer to such a payload; a small payload with an
// idempotency key of nearly a MiB, an ERROR that says nothing was sent. (A request
// padded with a field the spec says to ignore is forwarded without it:
// TestSpecRequestsFillingAFrame.)
func TestClientPortSubmissionFillingAFrame(t *testing.T) {
	t.Parallel()
	s := setup(t)
	c := s.client()
	fill := func(prefix, unit, suffix string) []byte {
		n := (frame.MaxSize - len(prefix) - len(suffix)) / len(unit)
		b := []byte(prefix + strings.Repeat(unit, n) + suffix)
		b = append(b[:len(b)-len(suffix)], strings.Repeat(" ", frame.MaxSize-len(b))+suffix...) // exactly a frame
		if len(b) != frame.MaxSize {
			t.Fatalf("frame of %d bytes", len(b))
		}
		return b
	}
	big := fill(`{"type":"SUBMIT_JOB","taskType":"SHA256","maxAttempts":1,"payload":{"text":"`, `\u0001`, `"}}`)
	bigKey := fill(`{"type":"SUBMIT_JOB","taskType":"SHA256","maxAttempts":1,"payload":{"text":"x"},"idempotencyKey":"`, `k`, `"}`)
	for _, tc := range []struct {
		name  string
		frame []byte
		want  string
	}{
		{"BigPayload", big, fmt.Sprintf("Invalid payload: Payload exceeds %d bytes", protocol.MaxPayloadBytes)},
		{"BigKey", bigKey, "Request too large to forward: "},
	} {
		if err := c.SendPayload(tc.frame); err != nil {
			t.Fatal(err)
		}
		c.ExpectError(tc.want)
	}
	if l, ok := c.Request(&protocol.ListJobs{}).(*protocol.JobList); !ok || len(l.Jobs) != 0 {
		t.Fatalf("jobs %+v, want none stored (and the connection kept)", l)
	}
}
