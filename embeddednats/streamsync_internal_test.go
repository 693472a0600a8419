package embeddednats

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/internal/testkit"
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
			// nats-server finishes removing a deleted stream's store after it answered,
			// and refuses a store of the same name meanwhile ("error creating store for
			// stream", 2 runs in 15 under -race).
			testkit.Wait(t, 10*time.Second, func() error {
				_, err := js.CreateStream(ctx, cfg)
				return err
			})
			publish(3)
			check("after the stream was made again")
		})
	}
}

// TestStreamSyncRefuses: a stream Sync cannot cover is an error that names why: one
// it cannot find, and one that acknowledges writes before they reach its files (in
// memory, or in the asynchronous persist mode).
func TestStreamSyncRefuses(t *testing.T) {
	srv, nc, js := syncServer(t, nil)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "M", Subjects: []string{"m"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "A", Subjects: []string{"a"}, PersistMode: jetstream.AsyncPersistMode}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		stream, want string
		is           error
	}{
		{"NONE", "no stream NONE in account $G", ErrNoStreamFiles},
		{"M", "stream M (Memory, 1 replicas) is not a single file store", ErrUnsyncable},
		{"A", "stream A has persist mode Async, which acknowledges a write before it is written", ErrUnsyncable},
	} {
		err := srv.StreamSync(nc, tc.stream).Sync()
		if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("Sync of %s: %v; want an error saying %q", tc.stream, err, tc.want)
		}
	}
}

// TestStreamSyncReadsTheServersRecord: the directory Sync would fsync must hold the
// server's record of that stream (meta.inf), naming it: a record that names another
// stream, or says it is persisted asynchronously, is refused, not synced.
func TestStreamSyncReadsTheServersRecord(t *testing.T) {
	srv, nc, js := syncServer(t, nil)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}}); err != nil {
		t.Fatal(err)
	}
	meta := filepath.Join(srv.ns.JetStreamConfig().StoreDir, "$G", streamsDir, "S", server.JetStreamMetaFile)
	orig, err := os.ReadFile(meta)
	if err != nil {
		t.Fatalf("the server's record of stream S is not where Sync looks: %v", err)
	}
	if err := srv.StreamSync(nc, "S").Sync(); err != nil {
		t.Fatalf("Sync with the server's own record: %v", err)
	}
	for _, tc := range []struct {
		name, want string
		edit       func(*server.FileStreamInfo)
	}{
		{"AnotherStream", `names stream "T", not S`, func(r *server.FileStreamInfo) { r.Name = "T" }},
		{"AsyncPersist", "persist mode Async", func(r *server.FileStreamInfo) { r.PersistMode = server.AsyncPersistMode }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec server.FileStreamInfo
			if err := json.Unmarshal(orig, &rec); err != nil {
				t.Fatal(err)
			}
			tc.edit(&rec)
			data, err := json.Marshal(rec)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(meta, data, 0o600); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.WriteFile(meta, orig, 0o600) })
			if err := srv.StreamSync(nc, "S").Sync(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Sync with the record edited: %v; want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestAcknowledgedWriteIsInItsBlock pins what `serve --sync always` rests on (Sync
// fsyncs the newest block once writes are acknowledged): a lone server's file store
// in the default persist mode has written each message into the stream's newest
// block file (msgs/N.blk) by the time it acknowledges it, as plain file I/O reads it.
// It fails if a nats-server upgrade buffers acknowledged writes in memory (as its
// asynchronous persist mode does), or moves or renames the files. The stream is a KV
// bucket as the coordinator's job bucket is (history 1, per-message TTLs), its records
// written over and over, with small blocks so that the puts roll over several.
func TestAcknowledgedWriteIsInItsBlock(t *testing.T) {
	srv, nc, js := syncServer(t, nil)
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "JOBS", History: 1, Storage: jetstream.FileStorage,
		LimitMarkerTTL: time.Second, MaxBytes: 100 << 10}) // blocks of 32 KB
	if err != nil {
		t.Fatal(err)
	}
	y := srv.StreamSync(nc, "KV_JOBS")
	if err := y.Sync(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(srv.ns.JetStreamConfig().StoreDir, "$G", streamsDir, "KV_JOBS", msgsDir)
	if y.dir != dir {
		t.Fatalf("Sync covers %q, want the stream's message directory %q", y.dir, dir)
	}
	blocks := map[uint64]bool{}
	for i := range 200 {
		value := make([]byte, 1000)
		_, _ = rand.Read(value)
		if _, err := kv.Put(ctx, fmt.Sprintf("job-%02d", i%20), value); err != nil {
			t.Fatal(err)
		}
		// Acknowledged: the bytes must be in the newest block now, without any sync.
		top := newestBlock(t, dir)
		data, err := os.ReadFile(filepath.Join(dir, strconv.FormatUint(top, 10)+blkSuffix))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(data, value) {
			t.Fatalf("put %d acknowledged, but its value is not in the newest block %d.blk (%d bytes)", i, top, len(data))
		}
		blocks[top] = true
	}
	if len(blocks) < 3 {
		t.Fatalf("the puts went to %d blocks; want them to roll over several", len(blocks))
	}
}
