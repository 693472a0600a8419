package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol/mu"
	"github.com/jobbus/jobbus/internal/munode"
)

// muNodeCommand is the reference Mu node: it dials a bridge's Mu port, registers an
// address, echoes asks on its --echo paths, and with --ask asks once and prints the
// answer.
func muNodeCommand() *cli.Command {
	return &cli.Command{
		Name:  "mu-node",
		Usage: "a small reference Mu node: dials a bridge's --mu-port, echoes asks, and can ask others",
		Description: `Connects to --connect (a bridge's or serve's --mu-port), registers as --address with a
HEARTBEAT carrying it as senderAddress, and heartbeats until stopped. Asks and tells on each
--echo path are answered with their own payload. Bus nodes reach it as mu/<address>, Mu nodes
with "<path>@<address>".

With --ask it asks once instead and prints the RESPONSE payload, exit 0 even when that payload
is a spec ERROR ({"type":"ERROR",...}: read its type); a Mu ERROR exits 1. A path
names its destination: "<path>@<role>/<id>", "<path>@<role>", "<path>@<host:port>" (a Mu
node), or a client API subject, which takes the client port's request as payload.

Examples:
   jobbus mu-node --connect 127.0.0.1:7700 --address 10.0.0.5:27777
   jobbus mu-node --connect 127.0.0.1:7700 --address 10.0.0.6:27777 --ask echo@10.0.0.5:27777 --payload '{"hi":1}'
   jobbus mu-node --connect 127.0.0.1:7700 --address 10.0.0.6:27777 --ask jobbus.api.submit \
      --payload '{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"hi"}}'`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "connect", Value: "127.0.0.1:7700", Usage: "the Mu port to dial, host:port", EnvVars: env("mu-connect")},
			&cli.StringFlag{Name: "address", Required: true, Usage: "the node's address, host:port (its senderAddress; a bare name has port 0)", EnvVars: env("mu-address")},
			&cli.StringSliceFlag{Name: "echo", Value: cli.NewStringSlice("echo"), Usage: "a path whose asks are answered with their payload (repeatable)", EnvVars: env("mu-echo")},
			&cli.StringFlag{Name: "ask", Usage: "ask this path once, print the answer and exit", EnvVars: env("mu-ask")},
			&cli.StringFlag{Name: "payload", Usage: "the JSON payload of --ask", EnvVars: env("mu-payload")},
			&cli.Int64Flag{Name: "heartbeat-millis", Value: 5000, Usage: "how often the node sends HEARTBEAT", EnvVars: env("mu-heartbeat-millis")},
			&cli.Int64Flag{Name: "timeout-millis", Value: 10000, Usage: "bounds the registration, each write and --ask", EnvVars: env("mu-timeout-millis")},
		},
		Action: runMuNode,
	}
}

func runMuNode(c *cli.Context) error {
	log, err := logger(c)
	if err != nil {
		return err
	}
	self, err := mu.ParseAddress(c.String("address"))
	if err != nil {
		return usageError("--address: %v", err)
	}
	var payload json.RawMessage
	if p := c.String("payload"); p != "" {
		if !json.Valid([]byte(p)) {
			return usageError("--payload must be JSON, got %q", p)
		}
		payload = json.RawMessage(p)
	}
	timeout := millis(c, "timeout-millis")
	ctx, cancel := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	n, err := munode.Dial(ctx, c.String("connect"), self, munode.Options{
		Heartbeat: millis(c, "heartbeat-millis"), Timeout: timeout, Logger: log,
	})
	if err != nil {
		return err
	}
	defer n.Close()
	for _, p := range c.StringSlice("echo") {
		n.Handle(p, munode.Echo)
	}
	if path := c.String("ask"); path != "" {
		actx, acancel := context.WithTimeout(ctx, timeout)
		defer acancel()
		answer, err := n.Ask(actx, path, payload)
		if err != nil {
			return fmt.Errorf("ask %s: %w", path, err)
		}
		if len(answer) == 0 {
			answer = json.RawMessage("null")
		}
		_, err = fmt.Fprintln(c.App.Writer, string(answer))
		return err
	}
	log.Info("mu node registered", "address", self.String(), "connect", c.String("connect"), "echo", c.StringSlice("echo"))
	select {
	case <-ctx.Done():
		log.Info("mu node stopping")
		return nil
	case <-n.Done():
		if err := n.Err(); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("mu node: %w", err)
		}
		return nil
	}
}
