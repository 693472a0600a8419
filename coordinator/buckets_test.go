package coordinator_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
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

func openBucket(ctx context.Context, t *testing.T, nc *nats.Conn, name string, mod func(*coordinator.Config)) (jetstream.KeyValue, error) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := coordinator.DefaultConfig()
	if mod != nil {
		mod(&cfg)
	}
	return coordinator.OpenBucket(ctx, nc, js, cfg, jetstream.KeyValueConfig{Bucket: name, History: 1})
}

func replicas(t *testing.T, kv jetstream.KeyValue) int {
	t.Helper()
	st, err := kv.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas
}

func TestOpenBucketOnALoneServer(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	nc := dialServer(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("DefaultIsOneReplica", func(t *testing.T) {
		kv, err := openBucket(ctx, t, nc, "LONE", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := replicas(t, kv); got != 1 {
			t.Fatalf("replicas = %d, want 1", got)
		}
	})
	t.Run("ThreeIsRefusedAtOnce", func(t *testing.T) {
		// A lone server cannot replicate: waiting would never help.
		_, err := openBucket(ctx, t, nc, "LONE3", func(c *coordinator.Config) { c.Replicas = 3 })
		if err == nil || ctx.Err() != nil {
			t.Fatalf("OpenBucket(R3 on a lone server) = %v, want an immediate error", err)
		}
	})
}

func TestOpenBucketInACluster(t *testing.T) {
	t.Parallel()
	nodes := jobbustest.StartCluster(t, 3)
	nc := dialServer(t, nodes[0].ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The cluster has just formed: OpenBucket waits for its JetStream meta leader.
	kv, err := openBucket(ctx, t, nc, "JOBS", nil)
	if err != nil {
		t.Fatalf("OpenBucket: %v", err)
	}
	if got := replicas(t, kv); got != 3 {
		t.Fatalf("default replicas in a cluster of 3 = %d, want 3", got)
	}

	tests := []struct {
		name        string
		replicas    int
		reconfigure bool
		wantErr     error
		want        int
	}{
		{name: "SameCountIsAccepted", replicas: 3, want: 3},
		{name: "AnotherCountIsRefused", replicas: 1, wantErr: coordinator.ErrReplicasDiffer, want: 3},
		{name: "DefaultKeepsWhatExists", replicas: 0, want: 3},
		{name: "ReconfigureChangesIt", replicas: 1, reconfigure: true, want: 1},
		{name: "DefaultKeepsTheChangedCount", replicas: 0, want: 1},
	}
	for _, tt := range tests { // in order: each case starts from the bucket the last left
		t.Run(tt.name, func(t *testing.T) {
			_, err := openBucket(ctx, t, nc, "JOBS", func(c *coordinator.Config) {
				c.Replicas, c.ReconfigureBuckets = tt.replicas, tt.reconfigure
			})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("OpenBucket(--replicas %d) = %v, want %v", tt.replicas, err, tt.wantErr)
			}
			if err != nil && ctx.Err() != nil {
				t.Fatal("the refusal waited for the context instead of coming at once")
			}
			kv, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			b, err := kv.KeyValue(ctx, "JOBS")
			if err != nil {
				t.Fatal(err)
			}
			if got := replicas(t, b); got != tt.want {
				t.Fatalf("replicas after = %d, want %d", got, tt.want)
			}
		})
	}

	// More replicas than servers: JetStream cannot place them, as while a cluster is
	// still forming, so it is waited for; but after a few seconds a warning says what
	// to check. Before, the wait said so only at INFO, for ever.
	t.Run("MoreReplicasThanServersWarns", func(t *testing.T) {
		logs := new(testkit.Buffer)
		wctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := openBucket(wctx, t, nc, "TOO_MANY", func(c *coordinator.Config) {
				c.Replicas, c.Logger = 5, slog.New(slog.NewTextHandler(logs, nil))
			})
			done <- err
		}()
		testkit.Wait(t, 20*time.Second, func() error {
			if !strings.Contains(logs.String(), "level=WARN") {
				return errors.New("no warning yet")
			}
			return nil
		})
		stop()
		if err := <-done; err == nil {
			t.Fatal("OpenBucket with 5 replicas on 3 servers succeeded")
		}
		for _, want := range []string{"replicas=5", "--replicas", "routes", "TOO_MANY"} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("warning lacks %q:\n%s", want, logs.String())
			}
		}
	})
}

func TestOpenBucketWaitsForTheServer(t *testing.T) {
	t.Parallel()
	port := jobbustest.FreePorts(t, 1)[0]
	url := "nats://127.0.0.1:" + itoa(port)
	// A coordinator started before its NATS server: the connection retries, and so
	// does the bucket.
	nc, err := nats.Connect(url, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		kv  jetstream.KeyValue
		err error
	}
	done := make(chan result, 1)
	go func() {
		kv, err := openBucket(ctx, t, nc, "LATE", nil)
		done <- result{kv, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("OpenBucket returned before any server ran: %v", r.err)
	case <-time.After(300 * time.Millisecond): // long enough to have failed without retries
	}
	startServer(t, embeddednats.WithListen("127.0.0.1:"+itoa(port)))
	r := <-done
	if r.err != nil {
		t.Fatalf("OpenBucket after the server started: %v", r.err)
	}
	if got := replicas(t, r.kv); got != 1 {
		t.Fatalf("replicas = %d, want 1", got)
	}
}

func startServer(t *testing.T, opts ...embeddednats.Option) *embeddednats.Server {
	t.Helper()
	all := append([]embeddednats.Option{embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir())}, opts...)
	srv, err := embeddednats.Start(context.Background(), all...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return srv
}

func dialServer(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestOpenBucketKeepsItsTTL: the lease bucket's TTL (the leader lease) is changed only
// with ReconfigureBuckets, so every coordinator renews within the lease the bucket
// enforces.
func TestOpenBucketKeepsItsTTL(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	nc := dialServer(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	open := func(ttl time.Duration, reconfigure bool) error {
		cfg := coordinator.DefaultConfig()
		cfg.ReconfigureBuckets = reconfigure
		_, err := coordinator.OpenBucket(ctx, nc, js, cfg, jetstream.KeyValueConfig{Bucket: "LEASE", History: 1, TTL: ttl})
		return err
	}
	ttl := func() time.Duration {
		s, err := js.Stream(ctx, "KV_LEASE")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.MaxAge
	}
	if err := open(2*time.Second, false); err != nil {
		t.Fatal(err)
	}
	if err := open(2*time.Second, false); err != nil {
		t.Fatalf("the same TTL again: %v", err)
	}
	if err := open(time.Second, false); !errors.Is(err, coordinator.ErrLeaseDiffers) || ctx.Err() != nil {
		t.Fatalf("another TTL = %v, want %v at once", err, coordinator.ErrLeaseDiffers)
	}
	if got := ttl(); got != 2*time.Second {
		t.Fatalf("TTL after the refusal = %v, want 2s", got)
	}
	if err := open(time.Second, true); err != nil {
		t.Fatalf("another TTL with ReconfigureBuckets: %v", err)
	}
	if got := ttl(); got != time.Second {
		t.Fatalf("TTL after ReconfigureBuckets = %v, want 1s", got)
	}
}

// TestOpenBucketLimit: a bucket's limit (max bytes, jobsMaxBytes for the jobs) is set
// on a bucket that had none (one an earlier version created), kept when none is asked
// for (a coordinator that does not know the store's cap), and left off, with a
// warning, when JetStream cannot reserve it: the bucket opens either way.
func TestOpenBucketLimit(t *testing.T) {
	t.Parallel()
	nc := dialServer(t, startServer(t, embeddednats.WithJetStreamLimits(0, 4<<20)).ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func(bucket string, maxBytes int64) int64 {
		t.Helper()
		kv, err := coordinator.OpenBucket(ctx, nc, js, coordinator.DefaultConfig(),
			jetstream.KeyValueConfig{Bucket: bucket, History: 1, MaxBytes: maxBytes})
		if err != nil {
			t.Fatalf("OpenBucket(%s, max bytes %d): %v", bucket, maxBytes, err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.MaxBytes
	}
	if got := open("LIMITED", 0); got != -1 {
		t.Fatalf("a bucket created with no limit has max bytes %d, want -1", got)
	}
	for _, c := range []struct {
		what      string
		bucket    string
		ask, want int64
	}{
		{"the limit set on a bucket that had none", "LIMITED", 1 << 20, 1 << 20},
		{"none asked: the bucket's kept", "LIMITED", 0, 1 << 20},
		{"more than the store can reserve: the bucket's kept", "LIMITED", 8 << 20, 1 << 20},
		{"more than the store can reserve: a new bucket has none", "UNROOMY", 8 << 20, -1},
	} {
		if got := open(c.bucket, c.ask); got != c.want {
			t.Errorf("%s: asked for %d, the bucket has %d, want %d", c.what, c.ask, got, c.want)
		}
	}
}
