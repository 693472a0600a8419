package embeddednats

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// syncServer starts a lone server in a temporary store, and connects to it with dial.
func syncServer(t *testing.T, opts []Option, dial ...nats.Option) (*Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv, err := Start(context.Background(), append([]Option{WithListen("127.0.0.1:-1"), WithStoreDir(t.TempDir())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect(dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return srv, nc, js
}

// newestBlock is the highest block index in dir.
func newestBlock(t *testing.T, dir string) uint64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var top uint64
	for _, e := range ents {
		if idx, ok := blockIndex(e.Name()); ok {
			top = max(top, idx)
		}
	}
	return top
}

// TestStreamSyncCoversEveryBlock: Sync finds the stream's files in the account the
// connection is bound to, and follows JetStream as it starts new blocks and as the
// stream is deleted and made again (its block numbers start over).
func TestStreamSyncCoversEveryBlock(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(conf, []byte(`accounts: { TEAM: { jetstream: enabled, users: [{user: a, password: pw}] } }`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		opts    []Option
		dial    []nats.Option
		account string
	}{
		{"GlobalAccount", nil, nil, "$G"},
		{"NamedAccount", []Option{WithConfigFile(conf)}, []nats.Option{nats.UserInfo("a", "pw")}, "TEAM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, nc, js := syncServer(t, tc.opts, tc.dial...)
			ctx := context.Background()
			// A small MaxBytes makes small blocks (nats-server sizes them to a quarter, at least 32 KB).
			cfg := jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, MaxBytes: 100 << 10, Discard: jetstream.DiscardOld}
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			y := srv.StreamSync(nc, "S")
			dir := filepath.Join(srv.ns.JetStreamConfig().StoreDir, tc.account, "streams", "S", "msgs")
			publish := func(n int) {
				for i := range n {
					if _, err := js.Publish(ctx, "s.x", []byte(strings.Repeat("x", 1000)+string(rune('a'+i%26)))); err != nil {
						t.Fatal(err)
					}
				}
			}
			check := func(what string) {
				t.Helper()
				if err := y.Sync(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if y.dir != dir {
					t.Fatalf("%s: synced %q, want %q", what, y.dir, dir)
				}
				if top := newestBlock(t, dir); y.synced != top || top == 0 {
					t.Fatalf("%s: newest block synced %d, newest on disk %d", what, y.synced, top)
				}
			}
			publish(10)
			check("first sync")
			first := y.synced
			publish(300) // about 300 KB: blocks of 32 KB roll over, the oldest go
			check("after new blocks")
			if y.synced < first+2 {
				t.Fatalf("newest block %d after 300 KB, was %d: blocks did not roll over", y.synced, first)
			}
			if err := js.DeleteStream(ctx, "S"); err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			publish(3)
			check("after the stream was made again")
		})
	}
}

// TestStreamSyncRefuses: a stream Sync cannot cover is an error that names why.
func TestStreamSyncRefuses(t *testing.T) {
	srv, nc, js := syncServer(t, nil)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "M", Subjects: []string{"m"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		stream, want string
		is           error
	}{
		{"NONE", "no stream NONE in account $G", ErrNoStreamFiles},
		{"M", "stream M (Memory, 1 replicas) is not a single file store", nil},
	} {
		err := srv.StreamSync(nc, tc.stream).Sync()
		if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("Sync of %s: %v; want an error saying %q", tc.stream, err, tc.want)
		}
	}
}
