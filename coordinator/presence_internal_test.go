package coordinator

import (
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// jobbus cluster reads the lease under protocol.LeaderKey.
func TestLeaderKeyIsTheProtocols(t *testing.T) {
	if leaderKey != protocol.LeaderKey {
		t.Fatalf("leaderKey %q, protocol.LeaderKey %q", leaderKey, protocol.LeaderKey)
	}
}
