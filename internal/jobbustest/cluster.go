package jobbustest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jobbus/jobbus/embeddednats"
)

// StartCluster starts n routed embedded servers (cluster "jobbus-test", servers n0..),
// each on a free client port with its store in a temporary directory, all stopped when
// the test ends. The route ports were free a moment before; a parallel test may take one
// meanwhile, so a clash starts over on fresh ports. The cluster's JetStream elects its
// meta leader after this returns: callers wait for it (coordinator.OpenBucket does).
func StartCluster(t testing.TB, n int, opts ...embeddednats.Option) []*embeddednats.Server {
	t.Helper()
	return StartRestartableCluster(t, n, opts...).Nodes
}

// Cluster is routed embedded servers whose nodes a test can stop and start again on
// their stores and ports.
type Cluster struct {
	Nodes []*embeddednats.Server // nil where stopped
	opts  [][]embeddednats.Option
}

// StartRestartableCluster is StartCluster, with the options kept to start a node again.
func StartRestartableCluster(t testing.TB, n int, opts ...embeddednats.Option) *Cluster {
	t.Helper()
	for attempt := 0; ; attempt++ {
		ports := FreePorts(t, n)
		routes := make([]string, n)
		for i, p := range ports {
			routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
		}
		c := &Cluster{}
		var err error
		for i, p := range ports {
			var srv *embeddednats.Server
			all := append([]embeddednats.Option{
				embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()),
				embeddednats.WithServerName(fmt.Sprintf("n%d", i)),
				embeddednats.WithClusterRoutes("jobbus-test", fmt.Sprintf("127.0.0.1:%d", p), routes...),
			}, opts...)
			if srv, err = embeddednats.Start(context.Background(), all...); err != nil {
				break
			}
			c.Nodes, c.opts = append(c.Nodes, srv), append(c.opts, all)
		}
		if err == nil {
			t.Cleanup(func() {
				for _, srv := range c.Nodes {
					if srv != nil {
						shutdownServer(t, srv)
					}
				}
			})
			return c
		}
		for _, srv := range c.Nodes {
			shutdownServer(t, srv)
		}
		if !errors.Is(err, embeddednats.ErrPortInUse) || attempt == 4 {
			t.Fatalf("start cluster: %v", err)
		}
	}
}

// Stop shuts node i down.
func (c *Cluster) Stop(t testing.TB, i int) {
	t.Helper()
	shutdownServer(t, c.Nodes[i])
	c.Nodes[i] = nil
}

// Restart starts stopped node i again on its store, with its name and cluster port (its
// client port is a new one).
func (c *Cluster) Restart(t testing.TB, i int) {
	t.Helper()
	srv, err := embeddednats.Start(context.Background(), c.opts[i]...)
	if err != nil {
		t.Fatalf("restart n%d: %v", i, err)
	}
	c.Nodes[i] = srv
}

func shutdownServer(t testing.TB, srv *embeddednats.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// FreePorts returns n loopback ports that were free a moment ago.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}
