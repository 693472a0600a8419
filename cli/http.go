package cli

import (
	"github.com/urfave/cli/v2"
)

// httpListenFlag is --http-listen: the dashboard, /metrics, /healthz and /readyz.
func httpListenFlag(def string) cli.Flag {
	usage := "address of the HTTP listener: dashboard at /, Prometheus /metrics, /healthz, /readyz (\"-\" or empty: off); see docs/operations.md"
	return &cli.StringFlag{Name: "http-listen", Value: def, Usage: usage, EnvVars: env("http-listen")}
}

// httpListen is the address of --http-listen, "" when it is off.
func httpListen(c *cli.Context) string {
	if addr := c.String("http-listen"); addr != "-" {
		return addr
	}
	return ""
}
