package embeddednats_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher())
}

// start runs a server on a random loopback port with the given store dir
// (a fresh TempDir if empty) and shuts it down at the end of the test.
func start(t *testing.T, dir string, opts ...embeddednats.Option) *embeddednats.Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	all := append([]embeddednats.Option{
		embeddednats.WithListen("127.0.0.1:-1"),
		embeddednats.WithStoreDir(dir),
	}, opts...)
	srv, err := embeddednats.Start(context.Background(), all...)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { shutdown(t, srv) })
	return srv
}

func shutdown(t *testing.T, srv *embeddednats.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

func connect(t *testing.T, connect func() (*nats.Conn, error)) *nats.Conn {
	t.Helper()
	nc, err := connect()
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func kvRoundTrip(t *testing.T, nc *nats.Conn, bucket string, replicas int) jetstream.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Replicas: replicas, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatalf("CreateKeyValue: %v", err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatalf("Put: %v", err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "v1" {
		t.Fatalf("Get = %v, %v; want v1", e, err)
	}
	return kv
}

func TestStartAndConnect(t *testing.T) {
	t.Parallel()
	srv := start(t, "")
	if !strings.HasPrefix(srv.ClientURL(), "nats://127.0.0.1:") {
		t.Fatalf("ClientURL = %q, want loopback", srv.ClientURL())
	}
	tests := []struct {
		name    string
		connect func() (*nats.Conn, error)
	}{
		{"InProcess", func() (*nats.Conn, error) { return srv.Connect() }},
		{"URL", func() (*nats.Conn, error) { return nats.Connect(srv.ClientURL()) }},
		{"Dial", func() (*nats.Conn, error) { return embeddednats.Dial(context.Background(), srv.ClientURL()) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			nc := connect(t, tt.connect)
			kvRoundTrip(t, nc, "KV_"+tt.name, 1)
		})
	}
}

func TestStartDefaultListenIsLoopback(t *testing.T) {
	t.Parallel()
	if !strings.HasPrefix(embeddednats.DefaultListen, "127.0.0.1:") {
		t.Fatalf("DefaultListen = %q, want loopback", embeddednats.DefaultListen)
	}
	// A bare port also means loopback.
	srv := start(t, "", embeddednats.WithListen("-1"))
	if host := srv.NATS().Addr().(*net.TCPAddr).IP.String(); host != "127.0.0.1" {
		t.Fatalf("listening on %s, want 127.0.0.1", host)
	}
}

func TestStartPortInUse(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	_, err = embeddednats.Start(context.Background(),
		embeddednats.WithListen(l.Addr().String()), embeddednats.WithStoreDir(dir))
	if !errors.Is(err, embeddednats.ErrPortInUse) {
		t.Fatalf("Start = %v, want ErrPortInUse", err)
	}
	want := fmt.Sprintf("listen %s: port in use (stop the other server or pass --nats-listen", l.Addr())
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not contain %q", err, want)
	}
	// The failed start left the store directory free.
	start(t, dir)
}

func TestStartClusterPortInUse(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = embeddednats.Start(context.Background(),
		embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()),
		embeddednats.WithClusterRoutes("c", l.Addr().String(), "nats-route://"+l.Addr().String()))
	if !errors.Is(err, embeddednats.ErrPortInUse) {
		t.Fatalf("Start = %v, want ErrPortInUse", err)
	}
}

func TestStartStoreLocked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := embeddednats.Start(context.Background(),
		embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	if !embeddednats.StoreLocked(dir) {
		t.Error("StoreLocked = false while a server holds the store")
	}
	_, err = embeddednats.Start(context.Background(),
		embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(dir))
	if !errors.Is(err, embeddednats.ErrStoreLocked) {
		t.Fatalf("second Start = %v, want ErrStoreLocked", err)
	}
	want := fmt.Sprintf("store directory %s is locked by another server (stop it or pass --data-dir)", dir)
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not contain %q", err, want)
	}
	shutdown(t, first)
	// Once the first server is gone the directory is free again.
	waitUnlocked(t, dir)
	if embeddednats.StoreLocked(filepath.Join(dir, "none")) {
		t.Error("StoreLocked = true for a store that does not exist")
	}
	start(t, dir)
}

// waitUnlocked waits until nobody holds dir's lock. A server's release is not seen at
// once when another test of this process forks a command meanwhile: the child holds
// a copy of the lock file's descriptor until it executes the command.
func waitUnlocked(t *testing.T, dir string) {
	t.Helper()
	testkit.Wait(t, 10*time.Second, func() error {
		if embeddednats.StoreLocked(dir) {
			return errors.New("StoreLocked = true for a store nobody holds")
		}
		return nil
	})
}

func TestStartJetStreamFailure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// nats-server keeps JetStream under dir/jetstream; a file there stops it.
	if err := os.WriteFile(filepath.Join(dir, "jetstream"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := embeddednats.Start(context.Background(),
		embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(dir))
	if err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("Start = %v, want a JetStream storage error", err)
	}
	if err := os.Remove(filepath.Join(dir, "jetstream")); err != nil {
		t.Fatal(err)
	}
	waitUnlocked(t, dir)
	start(t, dir)
}

func TestStartInvalidOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opt  embeddednats.Option
		want string
	}{
		{"BadPort", embeddednats.WithListen("127.0.0.1:http"), "port must be"},
		{"PortTooHigh", embeddednats.WithListen("127.0.0.1:70000"), "port must be"},
		{"EmptyStore", embeddednats.WithStoreDir(""), "empty store directory"},
		{"ClusterNoName", embeddednats.WithClusterRoutes("", "127.0.0.1:-1"), "cluster needs a name"},
		{"BadRoute", embeddednats.WithClusterRoutes("c", "127.0.0.1:-1", "::nope"), "cluster route"},
		{"BadLeaf", embeddednats.WithLeafRemote("::nope"), "leaf remote"},
		// A URL that does not parse is named without the credentials it carries.
		{"BadRouteWithPassword", embeddednats.WithClusterRoutes("c", "127.0.0.1:-1", "nats-route://bob:topsecret@h:bad"), "cluster route \"nats-route://xxxxx@h:bad\""},
		{"BadLeafWithPassword", embeddednats.WithLeafRemote("nats-leaf://bob:topsecret@hub:bad"), "leaf remote \"nats-leaf://xxxxx@hub:bad\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := embeddednats.Start(context.Background(),
				embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()), tt.opt)
			if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "topsecret") {
				t.Fatalf("Start = %v, want error containing %q and no password", err, tt.want)
			}
		})
	}
}

func TestStartCancelledContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := embeddednats.Start(ctx, embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Start = %v, want context.Canceled", err)
	}
}

// recordHandler keeps the messages of the records it receives.
type recordHandler struct {
	level slog.Level
	mu    sync.Mutex
	msgs  map[slog.Level][]string
}

func (h *recordHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *recordHandler) WithGroup(string) slog.Handler                { return h }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs[r.Level] = append(h.msgs[r.Level], r.Message)
	return nil
}

func (h *recordHandler) count(l slog.Level, substr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs[l] {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

func TestStartLogger(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		level slog.Level
		want  int
	}{
		{"DebugSeesServerLines", slog.LevelDebug, 1},
		{"WarnHidesThem", slog.LevelWarn, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := &recordHandler{level: tt.level, msgs: map[slog.Level][]string{}}
			start(t, "", embeddednats.WithLogger(slog.New(h)))
			if got := h.count(slog.LevelDebug, "Server is ready"); got != tt.want {
				t.Fatalf("%d debug records %q, want %d", got, "Server is ready", tt.want)
			}
		})
	}
}

func TestShutdownIsIdempotentAndDurable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, err := embeddednats.Start(context.Background(),
		embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	kvRoundTrip(t, nc, "DURABLE", 1)
	nc.Close()

	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { shutdown(t, srv) })
	}
	wg.Wait()
	shutdown(t, srv)
	if srv.NATS().Running() {
		t.Fatal("server still running after Shutdown")
	}

	again := start(t, dir)
	nc2 := connect(t, func() (*nats.Conn, error) { return again.Connect() })
	js, err := jetstream.New(nc2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "DURABLE")
	if err != nil {
		t.Fatalf("bucket lost after restart: %v", err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "v1" {
		t.Fatalf("Get after restart = %v, %v; want v1", e, err)
	}
}

func TestShutdownContextExpired(t *testing.T) {
	t.Parallel()
	srv, err := embeddednats.Start(context.Background(),
		embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Either the shutdown already finished or the expired context is reported.
	if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown = %v", err)
	}
	// The background shutdown still completes and a later call sees it.
	shutdown(t, srv)
}

// startPlain runs a nats-server directly, with or without JetStream.
func startPlain(t *testing.T, o *server.Options) *server.Server {
	t.Helper()
	o.Host, o.Port, o.NoLog, o.NoSigs = "127.0.0.1", -1, true, true
	if o.JetStream {
		o.StoreDir = t.TempDir()
	}
	ns, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(5 * time.Second) {
		t.Fatal("plain server not ready")
	}
	return ns
}

func TestDialNoJetStream(t *testing.T) {
	t.Parallel()
	ns := startPlain(t, &server.Options{})
	nc, err := embeddednats.Dial(context.Background(), ns.ClientURL())
	if !errors.Is(err, embeddednats.ErrNoJetStream) {
		t.Fatalf("Dial = %v, %v; want ErrNoJetStream", nc, err)
	}
	want := fmt.Sprintf("JetStream is not enabled on %s (start nats-server with -js)", ns.ClientURL())
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not contain %q", err, want)
	}
}

func TestDialAuth(t *testing.T) {
	t.Parallel()
	tokenSrv := startPlain(t, &server.Options{JetStream: true, Authorization: "s3cret"})
	userSrv := startPlain(t, &server.Options{JetStream: true, Username: "bob", Password: "pw"})
	tests := []struct {
		name   string
		url    string
		opts   []embeddednats.DialOption
		wantOK bool
	}{
		{"TokenMissing", tokenSrv.ClientURL(), nil, false},
		{"TokenWrong", tokenSrv.ClientURL(), []embeddednats.DialOption{embeddednats.WithToken("nope")}, false},
		{"Token", tokenSrv.ClientURL(), []embeddednats.DialOption{embeddednats.WithToken("s3cret"), embeddednats.WithName("t")}, true},
		{"UserWrong", userSrv.ClientURL(), []embeddednats.DialOption{embeddednats.WithUserInfo("bob", "nope")}, false},
		{"User", userSrv.ClientURL(), []embeddednats.DialOption{embeddednats.WithUserInfo("bob", "pw")}, true},
		{"NATSOptions", userSrv.ClientURL(), []embeddednats.DialOption{embeddednats.WithNATSOptions(nats.UserInfo("bob", "pw"))}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			nc, err := embeddednats.Dial(ctx, tt.url, tt.opts...)
			if tt.wantOK {
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				defer nc.Close()
				kvRoundTrip(t, nc, "AUTH_"+tt.name, 1)
				return
			}
			if err == nil {
				nc.Close()
				t.Fatal("Dial succeeded, want an authorization error")
			}
			if errors.Is(err, embeddednats.ErrNoJetStream) || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				t.Fatalf("Dial = %v, want an authorization error", err)
			}
		})
	}
}

func TestDialUnreachableRedactsSecrets(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = embeddednats.Dial(ctx, "nats://bob:topsecret@"+addr)
	if err == nil {
		t.Fatal("Dial to a closed port succeeded")
	}
	if strings.Contains(err.Error(), "topsecret") || !strings.Contains(err.Error(), addr) {
		t.Fatalf("error %q: want the address and no password", err)
	}
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
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

// startCluster starts n routed servers. The route ports were free a moment before; a
// parallel test may take one meanwhile, so a clash starts over on fresh ports.
func startCluster(t *testing.T, n int) []*embeddednats.Server {
	t.Helper()
	for attempt := 0; ; attempt++ {
		ports := freePorts(t, n)
		routes := make([]string, n)
		for i, p := range ports {
			routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
		}
		var nodes []*embeddednats.Server
		var err error
		for i, p := range ports {
			var srv *embeddednats.Server
			srv, err = embeddednats.Start(context.Background(),
				embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir()),
				embeddednats.WithServerName(fmt.Sprintf("n%d", i)),
				embeddednats.WithClusterRoutes("jobbus-test", fmt.Sprintf("127.0.0.1:%d", p), routes...))
			if err != nil {
				break
			}
			nodes = append(nodes, srv)
		}
		if err == nil {
			for _, srv := range nodes {
				t.Cleanup(func() { shutdown(t, srv) })
			}
			return nodes
		}
		for _, srv := range nodes {
			shutdown(t, srv)
		}
		if !errors.Is(err, embeddednats.ErrPortInUse) || attempt == 4 {
			t.Fatalf("Start: %v", err)
		}
	}
}

func TestClusterOfThreeServesReplicatedKV(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3)
	nc0 := connect(t, func() (*nats.Conn, error) { return nodes[0].Connect() })
	nc2 := connect(t, func() (*nats.Conn, error) { return nodes[2].Connect() })
	js0, err := jetstream.New(nc0)
	if err != nil {
		t.Fatal(err)
	}
	// The meta leader is elected after start; retry until the bucket exists.
	var kv jetstream.KeyValue
	testkit.Wait(t, 10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		kv, err = js0.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "R3", Replicas: 3})
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("Put: %v", err)
	}
	js2, err := jetstream.New(nc2)
	if err != nil {
		t.Fatal(err)
	}
	kv2, err := js2.KeyValue(ctx, "R3")
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv2.Status(ctx)
	if err != nil || st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas != 3 {
		t.Fatalf("Status = %v, %v; want 3 replicas", st, err)
	}
	e, err := kv2.Get(ctx, "k")
	if err != nil || string(e.Value()) != "v" {
		t.Fatalf("Get via another node = %v, %v; want v", e, err)
	}
}

func TestLeafRemoteJoinsHub(t *testing.T) {
	t.Parallel()
	leafPort := freePorts(t, 1)[0]
	hub := startPlain(t, &server.Options{JetStream: true, JetStreamDomain: "hub",
		LeafNode: server.LeafNodeOpts{Host: "127.0.0.1", Port: leafPort}})
	leaf := start(t, "",
		embeddednats.WithLeafRemote(fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort)),
		embeddednats.WithJetStreamDomain("leaf"))

	hubNC := connect(t, func() (*nats.Conn, error) { return nats.Connect(hub.ClientURL()) })
	if _, err := hubNC.Subscribe("ping", func(m *nats.Msg) { _ = m.Respond([]byte("pong")) }); err != nil {
		t.Fatal(err)
	}
	if err := hubNC.Flush(); err != nil {
		t.Fatal(err)
	}
	leafNC := connect(t, func() (*nats.Conn, error) { return leaf.Connect() })
	// Interest crosses the leaf connection once it is up.
	testkit.Wait(t, 5*time.Second, func() error {
		m, err := leafNC.Request("ping", nil, 200*time.Millisecond)
		if err != nil {
			return err
		}
		if string(m.Data) != "pong" {
			return fmt.Errorf("reply %q", m.Data)
		}
		return nil
	})
	// The leaf keeps its own JetStream domain.
	kvRoundTrip(t, leafNC, "LEAF", 1)
}

func BenchmarkStartShutdown(b *testing.B) {
	dir := b.TempDir()
	for b.Loop() {
		srv, err := embeddednats.Start(context.Background(),
			embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(dir))
		if err != nil {
			b.Fatal(err)
		}
		if err := srv.Shutdown(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSyncOptions: WithSyncAlways and WithSyncInterval reach JetStream's configuration
// (serve --sync); without them the server keeps its own default, 2 minutes.
func TestSyncOptions(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		opts     []embeddednats.Option
		always   bool
		interval time.Duration
	}{
		{"Default", nil, false, 2 * time.Minute},
		{"Always", []embeddednats.Option{embeddednats.WithSyncAlways(true)}, true, 2 * time.Minute},
		{"Interval", []embeddednats.Option{embeddednats.WithSyncInterval(time.Second)}, false, time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := start(t, t.TempDir(), tc.opts...)
			cfg := srv.NATS().JetStreamConfig()
			if cfg == nil {
				t.Fatal("JetStream is off")
			}
			if cfg.SyncAlways != tc.always || cfg.SyncInterval != tc.interval {
				t.Errorf("SyncAlways %v, SyncInterval %v; want %v, %v", cfg.SyncAlways, cfg.SyncInterval, tc.always, tc.interval)
			}
		})
	}
}
