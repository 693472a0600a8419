package cli

import (
	"log/slog"

	"github.com/urfave/cli/v2"
)

// httpListenFlag is --http-listen: the dashboard, /metrics, /healthz and /readyz.
func httpListenFlag(def string) cli.Flag {
	usage := "address of the HTTP listener: dashboard at /, Prometheus /metrics, /healthz, /readyz (\"-\" or empty: off); see docs/operations.md"
	return &cli.StringFlag{Name: "http-listen", Value: def, Usage: usage, EnvVars: env("http-listen")}
}

// httpListen is the address of --http-listen, "" when it is off; it warns when the
// listener reaches beyond loopback.
func httpListen(c *cli.Context, log *slog.Logger) string {
	addr := c.String("http-listen")
	if addr == "-" {
		return ""
	}
	warnOpenHTTP(log, addr)
	return addr
}
