package cli

import (
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/embeddednats"
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

// defaultServerName is <host name>-<port of --nats-listen>: stable across restarts
// and distinct for several nodes on one box.
func defaultServerName(listen string) (string, error) {
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
