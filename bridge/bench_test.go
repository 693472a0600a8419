package bridge_test

import (
	"context"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// BenchmarkClientPortStatus is one GET_JOB_STATUS round trip through the bridge's
// client port (TCP frame -> NATS request -> coordinator -> reply frame); compare with
// BenchmarkNATSStatus, the same request sent natively.
func BenchmarkClientPortStatus(b *testing.B) {
	s := setup(b)
	c := s.client()
	id := c.Submit("SLEEP", `{"durationMillis":0}`)
	body, err := protocol.Encode(&protocol.GetJobStatus{JobID: id})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.SendPayload(body); err != nil {
			b.Fatal(err)
		}
		if _, err := c.RecvRaw(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNATSStatus is the same request over NATS with the Go client's DoRaw.
func BenchmarkNATSStatus(b *testing.B) {
	s := setup(b)
	id := s.client().Submit("SLEEP", `{"durationMillis":0}`)
	body, err := protocol.Encode(&protocol.GetJobStatus{JobID: id})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.native.DoRaw(ctx, protocol.TypeGetJobStatus, body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClientPortStatusParallel: many client connections at once, bounded by the
// bridge's in-flight limit.
func BenchmarkClientPortStatusParallel(b *testing.B) {
	s := setup(b)
	id := s.client().Submit("SLEEP", `{"durationMillis":0}`)
	body, err := protocol.Encode(&protocol.GetJobStatus{JobID: id})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		c := s.client()
		for pb.Next() {
			if err := c.SendPayload(body); err != nil {
				b.Error(err)
				return
			}
			if _, err := c.RecvRaw(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
