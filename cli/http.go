package cli

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/internal/dashboard"
	"github.com/jobbus/jobbus/internal/httpserver"
	"github.com/jobbus/jobbus/internal/metrics"
)

// httpListenFlag is --http-listen: the dashboard, /metrics, /healthz and /readyz.
func httpListenFlag(def string) cli.Flag {
	usage := "address of the HTTP listener: dashboard at /, Prometheus /metrics, /healthz, /readyz (\"-\" or empty: off); see docs/operations.md"
	return &cli.StringFlag{Name: "http-listen", Value: def, Usage: usage, EnvVars: env("http-listen")}
}

// startHTTP starts the HTTP listener of --http-listen on nc, serving the metrics of
// reg and the dashboard, unless it is off (then stop does nothing).
func startHTTP(ctx context.Context, c *cli.Context, nc *nats.Conn, log *slog.Logger, reg *metrics.Registry) (stop func(), err error) {
	addr := c.String("http-listen")
	if addr == "" || addr == "-" {
		return func() {}, nil
	}
	dash, err := dashboard.New(dashboard.Config{NC: nc, Logger: log})
	if err != nil {
		return nil, err
	}
	srv, err := httpserver.Start(ctx, httpserver.Config{
		Listen: addr, NC: nc, Metrics: reg.Handler(), Dashboard: dash, Logger: log,
	})
	if err != nil {
		_ = dash.Close()
		return nil, err
	}
	return func() {
		_ = srv.Close()
		_ = dash.Close()
	}, nil
}
