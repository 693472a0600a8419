package coordinator_test

import (
	"context"
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
	srv, err := embeddednats.Start(context.Background(), embeddednats.WithListen("127.0.0.1:-1"),
		embeddednats.WithStoreDir(t.TempDir()), embeddednats.WithJetStreamLimits(0, room))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
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
