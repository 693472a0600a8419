package client_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// BenchmarkSubmitNATS is the client's cost of one submission over NATS, answered at
// once by a responder that decodes nothing: what the request id and the failover
// handling (client/failover.go) add to every submission.
//
//	go test -run '^$' -bench SubmitNATS -benchmem -count 5 ./client/
func BenchmarkSubmitNATS(b *testing.B) {
	nc := jobbustest.Start(b, jobbustest.WithoutCoordinator()).NC
	reply := mustEncode(&protocol.JobSubmitted{JobID: "job-1"})
	sub, err := nc.Subscribe(submitSubject, func(m *nats.Msg) { _ = m.Respond(reply) })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	c := client.New(nc)
	ctx := context.Background()
	payload := map[string]string{"text": "x"}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Submit(ctx, "SHA256", payload); err != nil {
			b.Fatal(err)
		}
	}
}
