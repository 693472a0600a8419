package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestDiagnosisInACluster: the server leading a replicated stream going away is an
// election, not a disk; losing a majority of the stream's servers is a lost quorum.
func TestDiagnosisInACluster(t *testing.T) {
	t.Parallel()
	cl := jobbustest.StartRestartableCluster(t, 3)
	ctx := context.Background()
	var js jetstream.JetStream
	var nc *nats.Conn
	dial := func(i int) {
		var err error
		if nc, err = nats.Connect(cl.Nodes[i].ClientURL()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ = jetstream.New(nc)
	}
	dial(0)
	var leader int
	testkit.Wait(t, 60*time.Second, func() error { // the cluster's meta leader first
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		s, err := js.CreateOrUpdateStream(cctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3, Storage: jetstream.FileStorage})
		if err != nil {
			return err
		}
		info := s.CachedInfo()
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return errors.New("no stream leader yet")
		}
		leader = slices.IndexFunc(cl.Nodes, func(n *embeddednats.Server) bool { return n.NATS().Name() == info.Cluster.Leader })
		return nil
	})
	// Ask from a server that stays.
	survivor := (leader + 1) % 3
	dial(survivor)

	sent := time.Now()
	cl.Stop(t, leader)
	t.Run("Election", func(t *testing.T) {
		testkit.Wait(t, 30*time.Second, func() error {
			d := coordinator.DiagnoseStream(ctx, nc, js, "S", context.DeadlineExceeded, sent)
			if strings.Contains(d, "disk") {
				t.Fatalf("an election blamed on a disk: %s", d)
			}
			if !strings.HasPrefix(d, "JetStream is electing a new leader for stream S") {
				return fmt.Errorf("diagnosis %q (the meta leader may be electing first)", d)
			}
			return nil
		})
	})
	cl.Stop(t, 3-leader-survivor)
	t.Run("LostQuorum", func(t *testing.T) {
		testkit.Wait(t, 30*time.Second, func() error {
			d := coordinator.DiagnoseStream(ctx, nc, js, "S", context.DeadlineExceeded, time.Now())
			if strings.Contains(d, "disk") {
				t.Fatalf("a lost quorum blamed on a disk: %s", d)
			}
			if !strings.HasPrefix(d, "stream S has lost its quorum (1 of its 3 replicas reachable)") {
				return fmt.Errorf("diagnosis %q", d)
			}
			return nil
		})
	})
}
