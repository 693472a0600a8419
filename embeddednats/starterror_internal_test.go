package embeddednats

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// TestStartErrorPortTaken: a port taken between checkPortsFree and the server's own
// listen is ErrPortInUse, naming the address, for the client port and the cluster's
// (whose clash a caller retrying on fresh ports must recognise too); another fatal
// message is not.
func TestStartErrorPortTaken(t *testing.T) {
	o := &server.Options{Host: "127.0.0.1", Port: 4222, Cluster: server.ClusterOpts{Host: "127.0.0.1", Port: 6222}}
	for _, tc := range []struct {
		msg, addr string
		inUse     bool
	}{
		{"Error listening on port: 127.0.0.1:4222, \"listen tcp 127.0.0.1:4222: bind: address already in use\"", "127.0.0.1:4222", true},
		{"Error listening on router port: 6222 - listen tcp 127.0.0.1:6222: bind: address already in use", "127.0.0.1:6222", true},
		{"Error listening on router port: 6222 - listen tcp 127.0.0.1:6222: bind: permission denied", "", false},
		{"Could not start JetStream", "", false},
	} {
		err := startError(tc.msg, o)
		if errors.Is(err, ErrPortInUse) != tc.inUse || !strings.Contains(err.Error(), tc.addr) {
			t.Errorf("startError(%q) = %v; want in use %v, naming %q", tc.msg, err, tc.inUse, tc.addr)
		}
	}
}
