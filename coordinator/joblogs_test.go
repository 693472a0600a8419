package coordinator_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// TestJobLogsFitASmallStore: on a server whose JetStream store has less room than the
// logs stream's cap (serve --nats-max-store 64M, or a small disk), the stream is made
// all the same, capped at a share of the room so that job logs cannot crowd out the
// jobs: JetStream reserves a stream's MaxBytes and refuses one larger than its room.
func TestJobLogsFitASmallStore(t *testing.T) {
	t.Parallel()
	const room = 64 << 20
	nc := dialServer(t, startServer(t, embeddednats.WithJetStreamLimits(0, room)).ClientURL())
	for range 2 { // made, then kept as it is by the next coordinator
		c, err := coordinator.New(nc, jobbustest.FastCoordinatorConfig())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		stream, err := js.Stream(context.Background(), protocol.LogsStream)
		if err != nil {
			_ = c.Close()
			t.Fatalf("job logs stream on a %d-byte store: %v", room, err)
		}
		if got := stream.CachedInfo().Config.MaxBytes; got <= 0 || got > room/4 {
			t.Errorf("job logs stream MaxBytes %d, want 1..%d (a quarter of the store at most)", got, room/4)
		}
		_ = c.Close()
	}
}

// TestStoreShareGrowsWithTheCap: a store with a cap (serve's --nats-max-store) is
// shared between the job logs and the jobs bucket's own limit so that a larger cap
// never leaves the jobs less room, and the jobs always get a limit under the cap.
// Here the logs' cap is 64 MiB (1 GiB by default): a store of 64 MiB and one of a little
// more, 65 MiB, differ only by that little. (The jobs' limit fell from 51 MiB to none
// at all once the cap exceeded the logs' cap: the logs then reserved all of it but
// 1 MiB, too little to share, and a store full of jobs refused the lease's renewal.)
func TestStoreShareGrowsWithTheCap(t *testing.T) {
	t.Parallel()
	const logs = 64 << 20
	var last int64
	for _, room := range []int64{logs, logs + 1<<20, 2 * logs, 5 * logs} {
		srv, err := embeddednats.Start(context.Background(), embeddednats.WithListen("127.0.0.1:-1"),
			embeddednats.WithStoreDir(t.TempDir()), embeddednats.WithJetStreamLimits(0, room))
		if err != nil {
			t.Fatal(err)
		}
		nc, err := srv.Connect()
		if err != nil {
			t.Fatal(err)
		}
		cfg := jobbustest.FastCoordinatorConfig()
		cfg.JobLogBytes, cfg.StoreLimit = logs, room
		c, err := coordinator.New(nc, cfg)
		if err == nil {
			err = c.Start(context.Background())
		}
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		maxBytes := func(name string) int64 {
			s, err := js.Stream(context.Background(), name)
			if err != nil {
				t.Fatalf("store of %d bytes: stream %s: %v", room, name, err)
			}
			return s.CachedInfo().Config.MaxBytes
		}
		jobs, logged := maxBytes("KV_"+protocol.JobsBucket), maxBytes(protocol.LogsStream)
		t.Logf("store %d: jobs %d, logs %d", room, jobs, logged)
		if jobs <= 0 || jobs < last || jobs+logged > room {
			t.Errorf("store of %d bytes: jobs limited to %d (logs %d), want more than 0, at least the %d of a smaller store, and both under the cap", room, jobs, logged, last)
		}
		last = jobs
		_ = c.Close()
		nc.Close()
		_ = srv.Shutdown(context.Background())
	}
}

// TestJobLogsStreamDescription: the logs stream describes what it keeps of a job, as
// nats stream info shows it: its last LogChunksPerJob chunks (a job that logs a line
// at a time keeps that many lines, far less than the 1 MiB they may hold).
func TestJobLogsStreamDescription(t *testing.T) {
	t.Parallel()
	srv, err := embeddednats.Start(context.Background(), embeddednats.WithListen("127.0.0.1:-1"),
		embeddednats.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := coordinator.New(nc, jobbustest.FastCoordinatorConfig())
	if err == nil {
		err = c.Start(context.Background())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), protocol.LogsStream)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("its last %d chunks", protocol.LogChunksPerJob)
	if d := s.CachedInfo().Config.Description; !strings.Contains(d, want) {
		t.Errorf("logs stream description %q, want it to say %q", d, want)
	}
}
