package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/coordinator"
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

// answerServerInfo answers `jobbus cluster` for the embedded server srv on nc: its
// name, routes, leaf nodes and, on the JetStream meta leader, every peer's currency.
func answerServerInfo(nc *nats.Conn, srv *embeddednats.Server, log *slog.Logger) (stop func()) {
	sub, err := nc.Subscribe(protocol.ServersSubject, func(m *nats.Msg) {
		data, err := json.Marshal(serverInfo(srv))
		if err == nil {
			_ = m.Respond(data)
		}
	})
	if err != nil {
		log.Warn("server presence off: jobbus cluster will not list this server", "err", err)
		return func() {}
	}
	return func() { _ = sub.Unsubscribe() }
}

func serverInfo(srv *embeddednats.Server) protocol.Server {
	ns := srv.NATS()
	info := protocol.Server{Name: ns.Name(), Cluster: ns.ClusterName(), URL: srv.ClientURL(), JetStream: ns.JetStreamEnabled()}
	if rz, err := ns.Routez(nil); err == nil {
		for _, r := range rz.Routes {
			if r.RemoteName != "" && !slices.Contains(info.Routes, r.RemoteName) {
				info.Routes = append(info.Routes, r.RemoteName)
			}
		}
		slices.Sort(info.Routes)
	}
	if lz, err := ns.Leafz(nil); err == nil {
		for _, l := range lz.Leafs {
			if !slices.Contains(info.Leafnodes, l.Name) {
				info.Leafnodes = append(info.Leafnodes, l.Name)
			}
		}
		slices.Sort(info.Leafnodes)
	}
	if info.JetStream {
		if jz, err := ns.Jsz(&server.JSzOptions{}); err == nil && jz.Meta != nil {
			info.MetaLeader = jz.Meta.Leader
			for _, p := range jz.Meta.Replicas {
				info.Peers = append(info.Peers, protocol.Peer{Name: p.Name, Current: p.Current, Offline: p.Offline,
					ActiveMillis: p.Active.Milliseconds(), Lag: p.Lag})
			}
		}
	}
	return info
}

// isLeaf reports whether serve's embedded server is a leaf node (--leafnode-remote).
func isLeaf(c *cli.Context) bool { return len(splitList(c.StringSlice("leafnode-remote"))) > 0 }

// lone reports an embedded server in no cluster: its JetStream streams have one replica.
func lone(c *cli.Context) bool { return len(splitList(c.StringSlice("routes"))) == 0 && !isLeaf(c) }

// noCoordinator stands in for runCoordinator on a leaf node: the state and its
// coordinators are the hub's, reached over the leaf connection; the channel yields nil
// when ctx ends.
func noCoordinator(log *slog.Logger) func(context.Context, *nats.Conn, coordinator.Config, func(*coordinator.Coordinator)) <-chan error {
	return func(ctx context.Context, _ *nats.Conn, _ coordinator.Config, _ func(*coordinator.Coordinator)) <-chan error {
		log.Info("leaf node: no coordinator here; the hub's serve this site's workers and clients")
		done := make(chan error, 1)
		go func() {
			<-ctx.Done()
			done <- nil
		}()
		return done
	}
}
