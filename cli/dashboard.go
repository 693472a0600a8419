package cli

import (
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/internal/natsurl"
	"github.com/jobbus/jobbus/system"
)

func dashboardCommand() *cli.Command {
	return &cli.Command{
		Name:  "dashboard",
		Usage: "serve the web dashboard (and /healthz, /readyz) for a jobbus system on NATS (--nats)",
		Description: `Serves the same dashboard as serve's --http-listen, against the system whose NATS
is --nats: live jobs, workers, charts, cancel and resubmit. It only reads the job
bucket and talks to the coordinator's API, so it can run anywhere NATS is reachable.
More: docs/operations.md.

Example:
   jobbus dashboard --nats nats://nats.example:4222 --http-listen 127.0.0.1:8080`,
		Flags: []cli.Flag{httpListenFlag(system.DefaultHTTPListen)},
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			if a := c.String("http-listen"); a == "" || a == "-" {
				return usageError("--http-listen is off: nothing to serve")
			}
			target, err := natsTarget(c, false)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			sys, err := system.Start(ctx, system.Config{
				NATS: joinNATS(c, target), HTTPListen: httpListen(c, log), Metrics: true, Logger: log,
			})
			if err != nil {
				return err
			}
			log.Info("dashboard running", "nats", natsurl.Connected(sys.Conn()), "url", "http://"+c.String("http-listen")+"/")
			<-ctx.Done()
			_ = sys.Close()
			return nil
		},
	}
}
