package system

import (
	"log/slog"
	"net/http"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/system/internal/dashboard"
	"github.com/jobbus/jobbus/system/internal/httpserver"
)

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
