package system

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/system/internal/dashboard"
	"github.com/jobbus/jobbus/system/internal/httpserver"
)

// startHTTP starts the HTTP listener at addr on nc: the dashboard, and the metrics
// of metrics unless it is nil. stop closes both.
func startHTTP(ctx context.Context, addr string, nc *nats.Conn, log *slog.Logger, metrics http.Handler) (*httpserver.Server, func(), error) {
	dash, err := dashboard.New(dashboard.Config{NC: nc, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	srv, err := httpserver.Start(ctx, httpserver.Config{
		Listen: addr, NC: nc, Metrics: metrics, Dashboard: dash, Logger: log,
	})
	if err != nil {
		_ = dash.Close()
		return nil, nil, err
	}
	return srv, func() {
		_ = srv.Close()
		_ = dash.Close()
	}, nil
}
