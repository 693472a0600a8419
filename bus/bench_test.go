package bus_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
)

// benchPayload is a ~100-byte message, the size of a typical protocol message.
var benchPayload = []byte(`{"type":"TASK_RESULT","workerId":"worker-1a2b3c4d","jobId":"j-000042","attemptId":"a-3","success":true}`)

// BenchmarkBareRequest is the floor: plain NATS request-reply between two connections.
func BenchmarkBareRequest(b *testing.B) {
	s := startServer(b, -1)
	responder, requester := dial(b, s.url), dial(b, s.url)
	sub, err := responder.Subscribe("bench.bare", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := responder.Flush(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(benchPayload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := requester.Request("bench.bare", benchPayload, 5*time.Second); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAsk is the same round trip through bus: envelope, handler dispatch,
// pending-ask tracking and counters.
func BenchmarkAsk(b *testing.B) {
	s := startServer(b, -1)
	w := connect(b, s.url, worker("worker-1a2b3c4d"))
	c := connect(b, s.url, coordinator("c1"))
	if err := w.Handle("bench", func(_ context.Context, r *bus.Request) (any, error) { return r.Data, nil }); err != nil {
		b.Fatal(err)
	}
	if err := w.Conn().Flush(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.SetBytes(int64(len(benchPayload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bus.Ask[json.RawMessage](ctx, c, w.Self(), "bench", benchPayload); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAskTyped adds JSON encoding and decoding of a struct on both sides.
func BenchmarkAskTyped(b *testing.B) {
	type result struct {
		Type      string `json:"type"`
		WorkerID  string `json:"workerId"`
		JobID     string `json:"jobId"`
		AttemptID string `json:"attemptId"`
		Success   bool   `json:"success"`
	}
	s := startServer(b, -1)
	w := connect(b, s.url, worker("worker-1a2b3c4d"))
	c := connect(b, s.url, coordinator("c1"))
	err := bus.Handle(w, "bench", func(_ context.Context, _ bus.Address, r result) (result, error) { return r, nil })
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Conn().Flush(); err != nil {
		b.Fatal(err)
	}
	var req result
	if err := json.Unmarshal(benchPayload, &req); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bus.Ask[result](ctx, c, w.Self(), "bench", req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAskRole is a worker's ask to "any coordinator" (register, heartbeat, result):
// the role-wide subject and its queue group, the worker protocol's hot path.
func BenchmarkAskRole(b *testing.B) {
	s := startServer(b, -1)
	c := connect(b, s.url, coordinator("c1"))
	w := connect(b, s.url, worker("worker-1a2b3c4d"))
	echo := func(_ context.Context, r *bus.Request) (any, error) { return r.Data, nil }
	if err := c.Handle("bench", echo, bus.OnlyRole()); err != nil {
		b.Fatal(err)
	}
	to := bus.Address{Role: bus.RoleCoordinator}
	ctx := context.Background()
	b.SetBytes(int64(len(benchPayload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bus.Ask[json.RawMessage](ctx, w, to, "bench", benchPayload); err != nil {
			b.Fatal(err)
		}
	}
}
