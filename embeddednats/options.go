package embeddednats

import (
	"log/slog"
	"time"
)

// Defaults for Start.
const (
	DefaultListen       = "127.0.0.1:4222"
	DefaultStoreDir     = "./data"
	DefaultReadyTimeout = 5 * time.Second
)

// Option configures Start.
type Option func(*config)

type config struct {
	listen       string
	storeDir     string
	serverName   string
	cluster      *clusterConfig
	leafRemotes  []string
	jsDomain     string
	maxMem       int64
	maxStore     int64
	syncAlways   bool
	syncInterval time.Duration
	logger       *slog.Logger
	readyTimeout time.Duration
	httpListen   string
	sysUser      string
	sysPassword  string
	user         string // auth.go
	password     string
	token        string
	configFile   string
	pingInterval time.Duration
	maxPingsOut  int
	leafListen   string
	noJetStream  bool
	storeCheck   time.Duration // storeguard.go; 0: no guard
	storeProbe   int64
}

type clusterConfig struct {
	name   string
	listen string
	routes []string
}

func defaultConfig() config {
	return config{
		listen:       DefaultListen,
		storeDir:     DefaultStoreDir,
		readyTimeout: DefaultReadyTimeout,
	}
}

// WithListen sets the client listen address, "host:port". Port 0 or -1 picks
// a random free port; a bare port ("-1", "4333") listens on 127.0.0.1. An
// empty host (":4222") listens on every interface, so only pass it on purpose.
// Default DefaultListen (loopback only).
func WithListen(hostport string) Option {
	return func(c *config) { c.listen = hostport }
}

// WithStoreDir sets the directory that holds the JetStream store (under
// dir/jetstream) and the lock file that keeps a second server out.
// Default DefaultStoreDir.
func WithStoreDir(dir string) Option {
	return func(c *config) { c.storeDir = dir }
}

// WithServerName sets the server name. Give every node of a cluster a
// stable, unique name so that its JetStream identity survives a restart.
func WithServerName(name string) Option {
	return func(c *config) { c.serverName = name }
}

// WithClusterRoutes joins a cluster: name is the cluster name, listen the
// route listen address ("host:port", port -1 for random) and routes the
// nats-route:// URLs of the cluster's nodes (listing this node too is fine).
// JetStream expects as many nodes as routes, so list them all.
func WithClusterRoutes(name, listen string, routes ...string) Option {
	return func(c *config) {
		c.cluster = &clusterConfig{name: name, listen: listen, routes: routes}
	}
}

// WithLeafRemote adds a leaf-node remote URL (nats-leaf://host:7422) that
// this server solicits. Repeat the option for several remotes.
func WithLeafRemote(url string) Option {
	return func(c *config) { c.leafRemotes = append(c.leafRemotes, url) }
}

// WithJetStreamDomain sets the JetStream domain, which keeps a leaf node's
// JetStream apart from its hub's.
func WithJetStreamDomain(domain string) Option {
	return func(c *config) { c.jsDomain = domain }
}

// WithJetStreamLimits caps JetStream memory and file storage in bytes;
// 0 keeps the server's dynamic default.
func WithJetStreamLimits(maxMem, maxStore int64) Option {
	return func(c *config) { c.maxMem, c.maxStore = maxMem, maxStore }
}

// WithSyncAlways makes JetStream fsync every write instead of on an interval.
func WithSyncAlways(on bool) Option {
	return func(c *config) { c.syncAlways = on }
}

// WithSyncInterval sets how often JetStream fsyncs its files when not on every write
// (nats-server's default is 2 minutes); 0 keeps the server's default.
func WithSyncInterval(d time.Duration) Option {
	return func(c *config) { c.syncInterval = d }
}

// WithLogger routes the server's log lines to l: notices and debug lines at
// debug level, warnings and errors at warn, fatal errors at error. Without it
// the server is silent.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithReadyTimeout bounds how long Start waits for the server to accept
// connections. Default DefaultReadyTimeout; a sooner context deadline wins.
func WithReadyTimeout(d time.Duration) Option {
	return func(c *config) { c.readyTimeout = d }
}

// WithHTTPListen turns on the server's monitoring endpoint (/varz, /jsz, /healthz ...)
// at "host:port" (port 0 or -1 picks a free one; a bare port listens on 127.0.0.1).
// Off by default.
func WithHTTPListen(hostport string) Option {
	return func(c *config) { c.httpListen = hostport }
}

// WithSystemUser adds a user of the system account ($SYS), so that the NATS CLI's
// server commands (`nats server report jetstream`, `nats server ls`) work against the
// embedded server. Clients that give no user name keep landing in the jobbus account,
// as without this option. Off by default; the password must not be empty.
func WithSystemUser(user, password string) Option {
	return func(c *config) { c.sysUser, c.sysPassword = user, password }
}

// Recommended ping settings (WithPing, ServiceOptions): a peer that stops answering (a
// SIGSTOPped or frozen process, a cut link) is dropped within about
// PingInterval * (MaxPingsOut + 1), about 6 s, instead of nats-server's default of 2
// minutes * 2; its subscriptions (a paused coordinator's queue subscriptions among them)
// go with it, so requests stop going where nobody answers. A PING costs a few bytes per
// connection per interval.
const (
	PingInterval = 2 * time.Second
	MaxPingsOut  = 2
)

// WithPing sets how often the server pings each client, route and leaf connection
// that has been silent, and after how many unanswered pings it closes it (nats-server's
// ping_interval and ping_max). Zero values keep nats-server's defaults (2 minutes, 2);
// PingInterval and MaxPingsOut are what serve uses.
func WithPing(interval time.Duration, maxOut int) Option {
	return func(c *config) { c.pingInterval, c.maxPingsOut = interval, maxOut }
}

// WithLeafListen accepts leaf-node connections at "host:port" (port 7422 by convention):
// an edge server started WithLeafRemote dials it, from behind NAT if need be. Off by
// default.
func WithLeafListen(hostport string) Option {
	return func(c *config) { c.leafListen = hostport }
}

// WithoutJetStream runs the server without JetStream of its own: a leaf node whose
// clients use the JetStream of the cluster it dials (WithLeafRemote), so the edge keeps
// no state and the hub's buckets are the only ones.
func WithoutJetStream() Option {
	return func(c *config) { c.noJetStream = true }
}
