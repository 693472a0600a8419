package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/tasktype"
	"github.com/jobbus/jobbus/embeddednats"
)

// TestCatalogueLoadSeesKeysRewrittenMeanwhile: two task types declared again while the
// catalogue is read at start (a deposed leader still serving registrations), the first
// already read and the last not yet, are both loaded. kv.ListKeys, which load used,
// counted the first one's rewrite as the last key and stopped: the last type was
// unknown. The records carry a header of 1 KiB so that JetStream's flow control holds
// back most of them (a push consumer's window is 2 MiB to start with) until the
// reader takes them: the rewrites land before the last record is sent, whatever the
// machine's speed.
func TestCatalogueLoadSeesKeysRewrittenMeanwhile(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := embeddednats.Start(ctx, embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()))
	must(t, err)
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect()
	must(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	must(t, err)

	cat := newCatalogue(tasktype.Builtins(), slog.New(slog.DiscardHandler))
	must(t, cat.open(ctx, nc, 1)) // empty: creates the bucket
	const n = 4000
	name := func(i int) string { return fmt.Sprintf("TYPE_%05d", i) }
	record := func(i int) []byte { return fmt.Appendf(nil, `{"name":%q,"options":{}}`, name(i)) }
	pad := strings.Repeat("x", 1024)
	for i := range n {
		m := nats.NewMsg("$KV." + protocol.TaskTypesBucket + "." + name(i))
		m.Header.Set("Pad", pad)
		m.Data = record(i)
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("records not stored")
	}

	loaded := make(chan error, 1)
	go func() { loaded <- cat.load(ctx) }()
	// Once the first record is sent to load's consumer, rewrite it, then the last one.
	var err2 error
	done := false
	for delivered := uint64(0); delivered == 0 && !done; {
		select {
		case err2 = <-loaded:
			done = true // too quick to catch: nothing to show
		case <-ctx.Done():
			t.Fatal("load's consumer never delivered")
		case <-time.After(time.Millisecond):
			for ci := range cat.stream.ListConsumers(ctx).Info() {
				delivered = max(delivered, ci.Delivered.Stream)
			}
		}
	}
	for _, i := range []int{0, n - 1} {
		if _, err := cat.kv.Put(ctx, name(i), record(i)); err != nil {
			t.Fatal(err)
		}
	}
	if !done {
		err2 = <-loaded
	}
	must(t, err2)
	got := cat.records()
	for _, i := range []int{0, n / 2, n - 1} {
		if _, ok := got[name(i)]; !ok {
			t.Errorf("task type %s not loaded (%d of %d loaded)", name(i), len(got), n)
		}
	}
	if len(got) != n {
		t.Errorf("%d task types loaded, want %d", len(got), n)
	}
}
