package coordinator_test

import (
	"testing"

	"github.com/jobbus/jobbus/client"
)

// transport is how clients and workers reach the coordinator in a test: natively over
// NATS, through the bridge's TCP ports, or a mix. Every lifecycle test runs over each
// (the conformance suite): neither side may be able to tell.
type transport struct {
	name    string
	bridged bool
	client  func(s *system) *client.Client
	worker  func(s *system, capacity int) (runner, func())
	peer    func(s *system, id string) peer
}

var transports = []transport{{name: "Native", client: natsClient, worker: nativeWorker, peer: newBusPeer}}

// forEachTransport runs test once per transport, in parallel.
func forEachTransport(t *testing.T, test func(t *testing.T, tr transport)) {
	t.Helper()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			test(t, tr)
		})
	}
}

func natsClient(s *system) *client.Client { return client.New(s.NC) }
