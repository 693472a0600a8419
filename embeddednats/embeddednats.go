// Package embeddednats runs an in-process nats-server with JetStream, or
// connects to an existing NATS server and checks that it offers JetStream.
//
// It knows nothing of jobs: it hands out *nats.Conn values and nothing more.
// The default server listens on loopback only and keeps its store under
// ./data; a lock file there keeps a second server off the same store.
//
//	srv, err := embeddednats.Start(ctx, embeddednats.WithStoreDir(dir))
//	...
//	defer srv.Shutdown(context.Background())
//	nc, err := srv.Connect()
package embeddednats

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/internal/natsurl"
)

// Server is a running in-process nats-server with JetStream.
type Server struct {
	ns   *server.Server
	lock *dirLock
	// authenticated: clients must give credentials (auth.go).
	authenticated bool
	listenHost    string
	storeDir      string      // where JetStream keeps its data: a config file's store_dir wins
	guard         *storeGuard // nil unless WithStoreGuard

	shutdownOnce sync.Once
	done         chan struct{} // closed when shutdown and unlock finished
	shutdownErr  error         // written before done is closed
}

// Start starts a nats-server with JetStream and waits until it accepts
// connections. It fails fast, with an error naming the fix, when a listen
// port is taken (ErrPortInUse) or the store directory is in use
// (ErrStoreLocked).
func Start(ctx context.Context, opts ...Option) (*Server, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	sopts, err := cfg.serverOptions()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("embeddednats: start: %w", err)
	}
	if err := checkPortsFree(sopts); err != nil {
		return nil, err
	}
	lock, err := lockDir(cfg.storeDir)
	if err != nil {
		return nil, err
	}
	auth, host, globalJS := authenticated(sopts), sopts.Host, needsGlobalJetStream(sopts) // before the server rewrites sopts
	ns, err := runServer(ctx, sopts, &cfg)
	if err == nil && globalJS {
		err = enableGlobalJetStream(ns)
	}
	if err != nil {
		_ = lock.release()
		return nil, err
	}
	guard := startStoreGuard(ns, sopts, &cfg, globalJS)
	return &Server{ns: ns, lock: lock, done: make(chan struct{}), authenticated: auth, listenHost: host, storeDir: cfg.storeDir, guard: guard}, nil
}

// runServer creates and starts the server and waits until it is ready.
func runServer(ctx context.Context, sopts *server.Options, cfg *config) (*server.Server, error) {
	ns, err := server.NewServer(sopts)
	if err != nil {
		return nil, fmt.Errorf("embeddednats: configure server: %w", err)
	}
	logger := newSlogAdapter(cfg.logger)
	ns.SetLoggerV2(logger, logger.debugEnabled(), false, false)

	// Start is synchronous up to the accept loop, so a failure reported
	// through Fatalf (JetStream, client listener) is known when it returns.
	ns.Start()
	fail := func(err error) (*server.Server, error) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, err
	}
	if msg := logger.fatalMsg(); msg != "" {
		return fail(startError(msg, sopts))
	}
	wait := cfg.readyTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
		wait = time.Until(dl)
	}
	if !ns.ReadyForConnections(wait) {
		if msg := logger.fatalMsg(); msg != "" {
			return fail(startError(msg, sopts))
		}
		return fail(fmt.Errorf("embeddednats: server not ready for connections after %s (raise the ready timeout)", wait))
	}
	if !cfg.noJetStream && !ns.JetStreamEnabled() {
		return fail(errors.New("embeddednats: start server: JetStream did not start"))
	}
	return ns, nil
}

// StoreDir is the store directory the server runs on: WithStoreDir's, or the
// store_dir of WithConfigFile's file when it sets one.
func (s *Server) StoreDir() string { return s.storeDir }

// ClientURL returns the URL clients use to reach the server, e.g.
// nats://127.0.0.1:4222.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// MonitorURL returns the URL of the monitoring endpoint, e.g. http://127.0.0.1:8222,
// or "" when WithHTTPListen was not given.
func (s *Server) MonitorURL() string {
	addr := s.ns.MonitorAddr()
	if addr == nil {
		return ""
	}
	return "http://" + addr.String()
}

// Connect opens a connection that talks to the server in-process, without
// TCP. opts are applied after the in-process option. Close the connection
// before Shutdown (or pass nats.NoReconnect()): otherwise it keeps trying to
// reconnect to the stopped server.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	all := append([]nats.Option{nats.InProcessServer(s.ns)}, opts...)
	// In-process needs no TLS even when the client port requires it (the server
	// offers it as optional there); a tls:// URL would make nats.go insist on it.
	url := strings.Replace(s.ClientURL(), "tls://", "nats://", 1)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		return nil, fmt.Errorf("embeddednats: connect in-process: %w", err)
	}
	return nc, nil
}

// NATS returns the underlying server, for what this package does not wrap.
func (s *Server) NATS() *server.Server { return s.ns }

// Shutdown stops the server gracefully: it stops accepting connections,
// closes clients, flushes and closes the JetStream store, then releases the
// store directory. It returns early with ctx's error if ctx ends first; the
// shutdown still completes in the background. Later calls wait for the same
// shutdown and return its result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		go func() {
			defer close(s.done)
			if s.guard != nil {
				s.guard.close()
			}
			s.ns.Shutdown()
			s.ns.WaitForShutdown()
			if err := s.lock.release(); err != nil {
				s.shutdownErr = fmt.Errorf("embeddednats: release store lock: %w", err)
			}
		}()
	})
	select {
	case <-s.done:
		return s.shutdownErr
	case <-ctx.Done():
		return fmt.Errorf("embeddednats: shutdown: %w", ctx.Err())
	}
}

// serverOptions maps the config onto nats-server options.
// MaxAtomicBatch is the largest JetStream atomic batch an embedded server accepts
// (its max_batch_size): a workflow of protocol.MaxWorkflowSteps jobs and a batch's
// callbacks, with room to spare.
const MaxAtomicBatch = 10_100

func (c *config) serverOptions() (*server.Options, error) {
	host, port, err := parseHostPort(c.listen)
	if err != nil {
		return nil, fmt.Errorf("embeddednats: listen address: %w", err)
	}
	if c.storeDir == "" {
		return nil, errors.New("embeddednats: empty store directory (pass a directory)")
	}
	o := &server.Options{
		ServerName:             c.serverName,
		Host:                   host,
		Port:                   port,
		JetStream:              !c.noJetStream,
		PingInterval:           c.pingInterval,
		MaxPingsOut:            c.maxPingsOut,
		StoreDir:               c.storeDir,
		JetStreamMaxMemory:     c.maxMem,
		JetStreamMaxStore:      c.maxStore,
		JetStreamDomain:        c.jsDomain,
		SyncAlways:             c.syncAlways,
		SyncInterval:           c.syncInterval,
		NoLog:                  true, // the adapter set in runServer logs instead
		NoSigs:                 true, // signals belong to the host process
		DisableJetStreamBanner: true,
		// A workflow's jobs are stored in one atomic batch: up to 10,000 steps and a
		// batch's two callbacks (nats-server allows 1,000 messages by default). The
		// request that carries them is one message, so the batch stays within 1 MiB
		// of payloads.
		JetStreamLimits: server.JSLimitOpts{MaxBatchSize: MaxAtomicBatch},
	}
	if err := c.monitorOptions(o); err != nil {
		return nil, err
	}
	if err := c.clusterOptions(o); err != nil {
		return nil, err
	}
	if err := c.leafOptions(o); err != nil {
		return nil, err
	}
	if err := c.authOptions(o); err != nil {
		return nil, err
	}
	if c.configFile != "" {
		return c.fileOptions(o)
	}
	return o, nil
}

func (c *config) clusterOptions(o *server.Options) error {
	if c.cluster == nil {
		return nil
	}
	if c.cluster.name == "" {
		return errors.New("embeddednats: cluster needs a name")
	}
	host, port, err := parseHostPort(c.cluster.listen)
	if err != nil {
		return fmt.Errorf("embeddednats: cluster listen address: %w", err)
	}
	o.Cluster.Name = c.cluster.name
	o.Cluster.Host, o.Cluster.Port = host, port
	for _, r := range c.cluster.routes {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" {
			return fmt.Errorf("embeddednats: cluster route %q is not a URL like nats-route://host:6222", natsurl.Redact(r))
		}
		o.Routes = append(o.Routes, u)
	}
	return nil
}

func (c *config) leafOptions(o *server.Options) error {
	if c.leafListen != "" {
		host, port, err := parseHostPort(c.leafListen)
		if err != nil {
			return fmt.Errorf("embeddednats: leaf-node listen address: %w", err)
		}
		o.LeafNode.Host, o.LeafNode.Port = host, port
	}
	for _, r := range c.leafRemotes {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" {
			return fmt.Errorf("embeddednats: leaf remote %q is not a URL like nats-leaf://host:7422", natsurl.Redact(r))
		}
		o.LeafNode.Remotes = append(o.LeafNode.Remotes, &server.RemoteLeafOpts{URLs: []*url.URL{u}})
	}
	return nil
}

// parseHostPort reads "host:port" or a bare port (meaning 127.0.0.1). Port 0
// and -1 both mean random: nats-server reads 0 as "default port".
func parseHostPort(hp string) (string, int, error) {
	if !strings.Contains(hp, ":") {
		hp = "127.0.0.1:" + hp
	}
	host, ps, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < -1 || port > 65535 {
		return "", 0, fmt.Errorf("%q: port must be -1 (random) or 0..65535", hp)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// checkPortsFree binds and releases every fixed listen port, so that a clash
// becomes ErrPortInUse here instead of a log line inside the server.
func checkPortsFree(o *server.Options) error {
	if err := checkPortFree(o.Host, o.Port, "--nats-listen 127.0.0.1:PORT"); err != nil {
		return err
	}
	if err := checkPortFree(o.HTTPHost, o.HTTPPort, "--nats-http-listen 127.0.0.1:PORT"); err != nil {
		return err
	}
	if o.Cluster.Port != 0 {
		return checkPortFree(o.Cluster.Host, o.Cluster.Port, "another cluster listen address")
	}
	return nil
}

func checkPortFree(host string, port int, fix string) error {
	if port <= 0 {
		return nil
	}
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	l, err := net.Listen("tcp", hp)
	if err == nil {
		return l.Close()
	}
	if isAddrInUse(err) {
		return portInUse(hp, fix, err)
	}
	return fmt.Errorf("embeddednats: listen %s: %w", hp, err)
}

func portInUse(hp, fix string, cause error) error {
	return &hintError{
		msg:      fmt.Sprintf("embeddednats: listen %s: port in use (stop the other server or pass %s)", hp, fix),
		sentinel: ErrPortInUse,
		cause:    cause,
	}
}

// startError turns a fatal server message into an error. Another process
// can take a port between checkPortsFree and the server's own listen; the
// server then reports it only as text, so recognise that text.
func startError(msg string, o *server.Options) error {
	taken := strings.Contains(msg, "address already in use") || strings.Contains(msg, "Only one usage")
	switch {
	case taken && strings.Contains(msg, "Error listening on port"):
		hp := net.JoinHostPort(o.Host, strconv.Itoa(o.Port))
		return portInUse(hp, "--nats-listen 127.0.0.1:PORT", errors.New(msg))
	case taken && strings.Contains(msg, "Error listening on router port"):
		hp := net.JoinHostPort(o.Cluster.Host, strconv.Itoa(o.Cluster.Port))
		return portInUse(hp, "another cluster listen address", errors.New(msg))
	}
	return fmt.Errorf("embeddednats: start server: %s", msg)
}
