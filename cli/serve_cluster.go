package cli

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/natsurl"
)

// serveClusterFlags are serve's flags for an embedded server that is one node of a
// cluster (--routes), or a leaf node of one (--leafnode-remote).
func serveClusterFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "server-name", Usage: "the embedded NATS server's name, unique and stable in its cluster (default: <host name>-<NATS port>)", EnvVars: env("server-name")},
		&cli.StringFlag{Name: "cluster-name", Value: "jobbus", Usage: "the cluster's name, the same on every node (with --routes)", EnvVars: env("cluster-name")},
		&cli.StringFlag{Name: "cluster-listen", Usage: "address other nodes' routes reach this one at, e.g. 0.0.0.0:6222 (with --routes; default 127.0.0.1:6222)", EnvVars: env("cluster-listen")},
		&cli.StringSliceFlag{Name: "routes", Usage: "form a cluster: the route URL of every node, this one included (nats-route://host:6222,...); buckets get 3 replicas; see docs/deployment.md", EnvVars: env("routes")},
		&cli.StringSliceFlag{Name: "leafnode-remote", Usage: "be a leaf node of the cluster at this URL (nats-leaf://hub:7422), dialling out (behind NAT): no JetStream here, the hub's holds the state; see docs/deployment.md", EnvVars: env("leafnode-remote")},
		&cli.StringFlag{Name: "leafnode-listen", Usage: "accept leaf nodes (serve --leafnode-remote) at this address, e.g. 0.0.0.0:7422; off by default", EnvVars: env("leafnode-listen")},
	}
}

// embedClusterOptions maps the cluster flags onto embedded server options; it also
// sets the ping settings that drop a frozen peer within seconds.
func embedClusterOptions(c *cli.Context) ([]embeddednats.Option, error) {
	if err := checkEmbedFlags(c); err != nil {
		return nil, err
	}
	opts := []embeddednats.Option{embeddednats.WithPing(embeddednats.PingInterval, embeddednats.MaxPingsOut)}
	routes := splitList(c.StringSlice("routes"))
	leaves := splitList(c.StringSlice("leafnode-remote"))
	name := c.String("server-name")
	if name == "" {
		// A lone server on a random port keeps nats-server's own id as its name.
		n, err := defaultServerName(c.String("nats-listen"))
		clustered := len(routes) > 0 || len(leaves) > 0 || c.String("leafnode-listen") != ""
		if err != nil && clustered {
			return nil, err
		}
		name = n
	}
	if name != "" {
		opts = append(opts, embeddednats.WithServerName(name))
	}
	switch {
	case len(routes) > 0 && len(leaves) > 0:
		return nil, usageError("--routes and --leafnode-remote: a node is either in the cluster or a leaf of it, not both")
	case len(routes) > 0:
		listen := c.String("cluster-listen")
		if listen == "" {
			listen = "127.0.0.1:6222"
		}
		opts = append(opts, embeddednats.WithClusterRoutes(c.String("cluster-name"), listen, routes...))
	case len(leaves) > 0:
		if err := refuseLeafFlags(c); err != nil {
			return nil, err
		}
		for _, r := range leaves {
			opts = append(opts, embeddednats.WithLeafRemote(r))
		}
		opts = append(opts, embeddednats.WithoutJetStream())
	default:
		for _, f := range []string{"cluster-listen", "cluster-name"} {
			if givenOnCommandLine(c, f) {
				return nil, usageError("--%s needs --routes (the route URLs of the cluster's nodes)", f)
			}
		}
	}
	if hp := c.String("leafnode-listen"); hp != "" {
		opts = append(opts, embeddednats.WithLeafListen(hp))
	}
	return opts, nil
}

// refuseLeafFlags refuses, as serve --nats refuses the embedded server's flags, the
// flags a leaf node would ignore: it runs no coordinator (the hub's serve it) and no
// JetStream. Set in the environment, they are shared configuration and stay unused.
func refuseLeafFlags(c *cli.Context) error {
	ignored := []string{"sync", "nats-max-store"}
	for _, f := range coordinatorFlags() {
		ignored = append(ignored, f.Names()[0])
	}
	for _, f := range ignored {
		if c.IsSet(f) && givenOnCommandLine(c, f) {
			return usageError("--%s does not apply to a leaf node (--leafnode-remote): it runs no coordinator and no JetStream; the hub's coordinators and buckets serve it (docs/deployment.md)", f)
		}
	}
	return nil
}

// checkEmbedFlags refuses, naming the flag, the values of the embedded server's flags
// that embeddednats or nats-server would refuse later in words of their own (exit 1), or
// take for something else (a route without a port).
func checkEmbedFlags(c *cli.Context) error {
	for _, f := range []string{"server-name", "cluster-name"} {
		if strings.ContainsAny(c.String(f), " \t\n") {
			return usageError("--%s must not contain spaces, got %q", f, c.String(f))
		}
	}
	if c.String("cluster-name") == "" && len(splitList(c.StringSlice("routes"))) > 0 {
		return usageError("--cluster-name must not be empty: give every node the same name")
	}
	for _, f := range []struct{ flag, example string }{
		{"nats-listen", "127.0.0.1:4222"}, {"nats-http-listen", "127.0.0.1:8222"}, {"cluster-listen", "0.0.0.0:6222"}, {"leafnode-listen", "0.0.0.0:7422"},
	} {
		if v := c.String(f.flag); v != "" {
			if err := checkHostPort(v); err != nil {
				return usageError("--%s must be HOST:PORT like %s, got %q: %v", f.flag, f.example, v, err)
			}
		}
	}
	// A route needs its port (nats-server dials the URL's host as it is); a leaf remote
	// without one dials 7422.
	for _, r := range splitList(c.StringSlice("routes")) {
		if u, err := url.Parse(r); err != nil || u.Hostname() == "" || u.Port() == "" {
			return usageError("--routes: %q is not a URL like nats-route://host:6222", natsurl.Redact(r))
		}
	}
	for _, r := range splitList(c.StringSlice("leafnode-remote")) {
		if u, err := url.Parse(r); err != nil || u.Hostname() == "" {
			return usageError("--leafnode-remote: %q is not a URL like nats-leaf://hub:7422", natsurl.Redact(r))
		}
	}
	return nil
}

// checkHostPort checks a listen address as embeddednats reads it: host:port, or a
// bare port, with a port of -1 (random) or 0..65535.
func checkHostPort(hp string) error {
	if !strings.Contains(hp, ":") {
		hp = "127.0.0.1:" + hp
	}
	_, p, err := net.SplitHostPort(hp)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(p); err != nil || n < -1 || n > 65535 {
		return fmt.Errorf("port must be -1 (random) or 0..65535")
	}
	return nil
}

// defaultServerName is <host name>-<port of --nats-listen>: stable across restarts
// and distinct for several nodes on one box.
func defaultServerName(listen string) (string, error) {
	if !strings.Contains(listen, ":") { // a bare port, as --nats-listen takes it
		listen = "127.0.0.1:" + listen
	}
	_, port, err := net.SplitHostPort(listen)
	if err != nil || port == "0" || port == "-1" {
		return "", usageError("--server-name: a cluster node needs a stable name; give one (or a fixed --nats-listen port)")
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "jobbus"
	}
	return fmt.Sprintf("%s-%s", host, port), nil
}

// splitList reads a list flag given as repeated flags or comma-separated values.
func splitList(values []string) []string {
	var out []string
	for _, v := range values {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// isLeaf reports whether serve's embedded server is a leaf node (--leafnode-remote).
func isLeaf(c *cli.Context) bool { return len(splitList(c.StringSlice("leafnode-remote"))) > 0 }

// lone reports an embedded server in no cluster: its JetStream streams have one replica.
func lone(c *cli.Context) bool { return len(splitList(c.StringSlice("routes"))) == 0 && !isLeaf(c) }
