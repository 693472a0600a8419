package bridge_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/internal/testkit/specpeer"
)

// TestNATSOutage: while the bridge's own NATS connection is down, every client request
// is answered "unavailable" at once (the request timeout is far longer than the test
// waits), and none of them reaches the coordinator once NATS is back: the jobs that
// exist afterwards are exactly those whose client got JOB_SUBMITTED. The NATS server is
// a real one on TCP, shut down and started again on the same port and store. The
// bridge's connection is the CLI's (no reconnect buffer), or nats.go's default, which
// buffers publishes while reconnecting: the bridge must not publish into it.
func TestNATSOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []nats.Option
	}{
		{"NoReconnectBuffer", []nats.Option{nats.ReconnectBufSize(-1)}},
		{"DefaultReconnectBuffer", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testNATSOutage(t, tc.opts...)
		})
	}
}

func testNATSOutage(t *testing.T, bridgeOpts ...nats.Option) {
	store := t.TempDir()
	srv := startNATS(t, "127.0.0.1:-1", store)
	url := srv.ClientURL()
	listen := strings.TrimPrefix(url, "nats://")

	dial := func(opts ...nats.Option) *nats.Conn {
		t.Helper()
		nc, err := nats.Connect(url, append([]nats.Option{
			nats.MaxReconnects(-1), nats.ReconnectWait(20 * time.Millisecond), nats.ReconnectJitter(0, 0),
		}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	coordNC := dial()
	cfg := jobbustest.FastCoordinatorConfig()
	calmCoordinator(&cfg)
	// A lease far longer than the outage: this test is about the bridge, not failover.
	cfg.LeaderLease = time.Minute
	coord, err := coordinator.New(coordNC, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = coord.Close() })
	if err := coord.Start(context.Background()); err != nil {
		t.Fatal(err)
	}

	bridgeNC := dial(bridgeOpts...)
	bcfg := fastBridge()
	bcfg.RequestTimeout = 10 * time.Minute // an answer within waitFor is not a timeout
	br := startBridge(t, bridgeNC, bcfg)
	peer := specpeer.Dial(t, br.ClientAddr().String(), specpeer.WithTimeout(waitFor))
	submit := func() protocol.Message {
		return peer.Request(&protocol.SubmitJob{TaskType: "SHA256", Payload: []byte(`{"text":"outage"}`)})
	}
	var accepted []string
	accept := func(m protocol.Message) {
		t.Helper()
		js, ok := m.(*protocol.JobSubmitted)
		if !ok {
			t.Fatalf("submit: got %T %+v, want JOB_SUBMITTED", m, m)
		}
		accepted = append(accepted, js.JobID)
	}
	accept(submit())

	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitFor, "the bridge to see NATS go", func() bool { return !bridgeNC.IsConnected() })
	const during = 5
	for range during {
		m := submit()
		e, ok := m.(*protocol.Error)
		if !ok || !strings.HasPrefix(e.Message, protocol.UnavailablePrefix) || !strings.Contains(e.Message, "NATS connection") {
			t.Fatalf("submit during the outage: got %T %+v, want ERROR coordinator unavailable: ... NATS connection ...", m, m)
		}
	}
	for _, req := range []protocol.Message{&protocol.ListJobs{}, &protocol.GetJobStatus{JobID: accepted[0]}} {
		if e, ok := peer.Request(req).(*protocol.Error); !ok || !strings.Contains(e.Message, "NATS connection") {
			t.Fatalf("%s during the outage: got %+v, want the unavailable ERROR", req.MessageType(), e)
		}
	}

	startNATS(t, listen, store)
	testkit.Eventually(t, waitFor, "both connections back", func() bool {
		return bridgeNC.IsConnected() && coordNC.IsConnected()
	})
	testkit.Wait(t, waitFor, func() error {
		m := submit()
		if js, ok := m.(*protocol.JobSubmitted); ok {
			accepted = append(accepted, js.JobID)
			return nil
		}
		return fmt.Errorf("submit after the outage: %+v", m)
	})
	// Anything a buffer held would have been flushed on reconnect, before the submission
	// just answered; a fresh connection reads what the coordinator stored.
	c := client.New(dial(), client.WithTimeout(waitFor))
	list, err := c.List(context.Background(), protocol.ListJobs{})
	if err != nil {
		t.Fatal(err)
	}
	jobs := list.Jobs
	if len(jobs) != len(accepted) {
		t.Fatalf("%d jobs exist, but only %d submissions were answered JOB_SUBMITTED (%v): %+v", len(jobs), len(accepted), accepted, jobs)
	}
	for _, j := range jobs {
		if !slices.Contains(accepted, j.JobID) {
			t.Errorf("job %s exists, but its client got ERROR", j.JobID)
		}
	}
}

// startNATS starts a NATS server on listen with its store in dir, shut down when the
// test ends.
func startNATS(t *testing.T, listen, dir string) *embeddednats.Server {
	t.Helper()
	srv, err := embeddednats.Start(context.Background(), embeddednats.WithListen(listen), embeddednats.WithStoreDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return srv
}
