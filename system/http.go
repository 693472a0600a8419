package system

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/system/internal/dashboard"
	"github.com/jobbus/jobbus/system/internal/httpserver"
)

// listenHTTP opens the HTTP listener at addr before NATS is there: while the system
// waits for its NATS (or its store) at start-up, /healthz answers and /readyz says
// why it is not ready, so that a liveness probe does not restart a process that only
// waits. mountHTTP serves the rest.
func listenHTTP(ctx context.Context, addr string, log *slog.Logger) (*httpserver.Server, error) {
	return httpserver.Listen(ctx, addr, log)
}

// mountHTTP serves the dashboard on srv, with nc, and the metrics of metrics unless
// it is nil. stop closes both.
func mountHTTP(srv *httpserver.Server, addr string, nc *nats.Conn, log *slog.Logger, metrics http.Handler) (stop func(), err error) {
	dash, err := dashboard.New(dashboard.Config{NC: nc, Logger: log})
	if err != nil {
		return nil, err
	}
	srv.Mount(httpserver.Config{Listen: addr, NC: nc, Metrics: metrics, Dashboard: dash, Logger: log})
	return func() {
		_ = srv.Close()
		_ = dash.Close()
	}, nil
}
