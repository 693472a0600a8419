package cli

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/internal/natsurl"
	"github.com/jobbus/jobbus/system"
)

// bridgeFlags are the TCP ports' flags, shared by `bridge` and `serve`. A port of -1
// turns that port off, 0 picks a free one (logged at start).
func bridgeFlags() []cli.Flag {
	d := bridge.DefaultConfig()
	return []cli.Flag{
		&cli.IntFlag{Name: "worker-port", Value: 7070, Usage: "TCP port for spec workers (-1: off, 0: any free port)", EnvVars: env("worker-port")},
		&cli.IntFlag{Name: "client-port", Value: 7071, Usage: "TCP port for spec clients (-1: off, 0: any free port)", EnvVars: env("client-port")},
		&cli.IntFlag{Name: "mu-port", Value: -1, Usage: "TCP port for Mu nodes (PowerJob's MuMessage frames; PowerJob's examples use 7700) (-1: off, 0: any free port)", EnvVars: env("mu-port")},
		millisFlag("mu-idle-timeout-millis", d.MuIdleTimeout, "a Mu connection that sends nothing (not even a HEARTBEAT) for this long is closed"),
		&cli.StringFlag{Name: "listen-host", Value: "127.0.0.1", Usage: "address the TCP ports listen on (loopback by default; 0.0.0.0 for every interface)", EnvVars: env("listen-host")},
		&cli.IntFlag{Name: "max-conns", Value: d.MaxConns, Usage: "open connections per TCP port; more are refused", EnvVars: env("max-conns")},
		&cli.IntFlag{Name: "max-requests", Value: d.MaxInFlight, Usage: "client-port requests waiting for the coordinator at once, across connections; also the asks in flight of one Mu connection (beyond: ERROR)", EnvVars: env("max-requests")},
		millisFlag("frame-stall-timeout-millis", d.FrameStallTimeout, "a frame that has begun must arrive within this time (slow peers are dropped)"),
		millisFlag("write-timeout-millis", d.WriteTimeout, "a peer must take each frame within this time"),
		millisFlag("request-timeout-millis", d.RequestTimeout, "how long a request waits for the coordinator"),
		&cli.StringFlag{Name: "bridge-tls-cert", Usage: "serve the TCP ports over TLS with this PEM certificate (with --bridge-tls-key); the spec's frames travel inside TLS", EnvVars: env("bridge-tls-cert")},
		&cli.StringFlag{Name: "bridge-tls-key", Usage: "the PEM private key of --bridge-tls-cert", EnvVars: env("bridge-tls-key")},
		&cli.StringFlag{Name: "bridge-tls-client-ca", Usage: "admit to the TCP ports only peers whose client certificate this PEM CA signed (needs --bridge-tls-cert); see docs/security.md", EnvVars: env("bridge-tls-client-ca")},
	}
}

// bridgeTLS is the TLS configuration of the TCP ports' flags, nil without them.
func bridgeTLS(c *cli.Context) (*tls.Config, error) {
	cert, key, ca := c.String("bridge-tls-cert"), c.String("bridge-tls-key"), c.String("bridge-tls-client-ca")
	switch {
	case cert == "" && key == "" && ca == "":
		return nil, nil
	case cert == "" || key == "":
		return nil, usageError("--bridge-tls-cert and --bridge-tls-key go together: give both")
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, usageError("--bridge-tls-cert %s, --bridge-tls-key %s: %v", cert, key, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, usageError("--bridge-tls-client-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usageError("--bridge-tls-client-ca %s: no PEM certificate in it", ca)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// bridgeConfig maps the flags onto a bridge configuration.
func bridgeConfig(c *cli.Context, log *slog.Logger) (bridge.Config, error) {
	ms := func(name string) time.Duration { return time.Duration(c.Int64(name)) * time.Millisecond }
	cfg := bridge.DefaultConfig()
	host := c.String("listen-host")
	for _, p := range []struct {
		flag string
		addr *string
	}{{"worker-port", &cfg.WorkerListen}, {"client-port", &cfg.ClientListen}, {"mu-port", &cfg.MuListen}} {
		port := c.Int(p.flag)
		switch {
		case port == -1:
			*p.addr = ""
		case port < 0 || port > 65535:
			return cfg, usageError("--%s must be -1 (off), 0 (any free port) or 1..65535, got %d", p.flag, port)
		default:
			*p.addr = net.JoinHostPort(host, strconv.Itoa(port))
		}
	}
	cfg.MaxConns = c.Int("max-conns")
	cfg.MaxInFlight = c.Int("max-requests")
	cfg.FrameStallTimeout = ms("frame-stall-timeout-millis")
	cfg.WriteTimeout = ms("write-timeout-millis")
	cfg.RequestTimeout = ms("request-timeout-millis")
	cfg.MuIdleTimeout = ms("mu-idle-timeout-millis")
	cfg.Logger = log
	tlsCfg, err := bridgeTLS(c)
	if err != nil {
		return cfg, err
	}
	cfg.TLS = tlsCfg
	return cfg, nil
}

// bridgeSystemConfig is the bridge of the TCP ports' flags in a system, nil when every
// port is off; it warns when they listen beyond loopback unauthenticated.
func bridgeSystemConfig(c *cli.Context, log *slog.Logger) (*bridge.Config, error) {
	cfg, err := bridgeConfig(c, log)
	if err != nil || cfg.WorkerListen == "" && cfg.ClientListen == "" && cfg.MuListen == "" {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, usageError("%v", err)
	}
	warnOpenPorts(log, c.String("listen-host"), cfg)
	return &cfg, nil
}

func bridgeCommand() *cli.Command {
	return &cli.Command{
		Name:  "bridge",
		Usage: "serve the TCP worker and client ports of docs/PROTOCOL.md for a coordinator on NATS (--nats)",
		Description: `Listens on --worker-port and --client-port (on --listen-host, loopback by default) and
forwards to the coordinator reachable through NATS. Several bridges may serve one coordinator.
With --mu-port it also serves Mu nodes (PowerJob's MuMessage frames), which join the bus.
A port of -1 is off; 0 picks a free port.

More: docs/PROTOCOL.md (the ports), docs/security.md (TLS and client certificates).

Example:
   jobbus --nats nats://127.0.0.1:4222 bridge --worker-port 7070 --client-port 7071`,
		Flags: append(bridgeFlags(), httpListenFlag("")),
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			bcfg, err := bridgeSystemConfig(c, log)
			if err != nil {
				return err
			}
			if bcfg == nil {
				return usageError("--worker-port, --client-port and --mu-port are all -1: nothing to serve")
			}
			if err := checkFree(servePorts(c, false), ""); err != nil {
				return err
			}
			target, err := natsTarget(c, false)
			if err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer cancel()
			// Alone on its connection, the bridge gives it its options (system.NATS).
			sys, err := system.Start(ctx, system.Config{
				NATS: joinNATS(c, target), Bridge: bcfg, HTTPListen: httpListen(c, log), Metrics: true, Logger: log,
			})
			if err != nil {
				return err
			}
			log.Info("bridge running", "nats", natsurl.Connected(sys.Conn()))
			<-ctx.Done()
			// Close gives the results already read their time (bridge.Config's
			// ShutdownTimeout); a second signal, no longer caught, stops at once.
			cancel()
			log.Info("bridge stopping: delivering the results already read (signal again to stop now)")
			_ = sys.Close()
			return nil
		},
	}
}
