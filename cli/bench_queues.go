package cli

import (
	"context"
	"fmt"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// bench --queues and --keys: the same load spread over named queues (which the
// in-process workers serve by the weights given) and concurrency keys, each queue set
// with limits far above the load, so that queues are configured but do not bind.

func benchQueuesFlag() cli.Flag {
	return &cli.StringFlag{Name: "queues", Usage: "spread the jobs round robin over these queues, which the in-process workers serve with these weights (critical=6,default=3,low=1); each queue gets limits the load never reaches", EnvVars: env("bench-queues")}
}

func benchKeysFlag() cli.Flag {
	return &cli.IntFlag{Name: "keys", Usage: "give the jobs concurrency keys, round robin over this many", EnvVars: env("bench-keys")}
}

// benchQueues reads --queues: nil without it.
func benchQueues(c *cli.Context) ([]protocol.QueueWeight, error) {
	spec := c.String("queues")
	if spec == "" {
		return nil, nil
	}
	qs, err := protocol.ParseQueueWeights(spec)
	if err != nil {
		return nil, usageError("--queues: %v", err)
	}
	return qs, nil
}

// useQueues sets the queues up (limits that do not bind) and remembers how to spread
// the jobs.
func (sys *benchSystem) useQueues(ctx context.Context, c *cli.Context) error {
	qs, err := benchQueues(c)
	if err != nil {
		return err
	}
	if c.Int("keys") < 0 {
		return usageError("--keys must not be negative, got %d", c.Int("keys"))
	}
	sys.keys = c.Int("keys")
	for _, q := range qs {
		sys.queues = append(sys.queues, q.Name)
		if _, err := sys.clients[0].SetQueue(ctx, q.Name, client.MaxRunning(protocol.MaxQueueMaxRunning), client.KeyConcurrency(protocol.MaxKeyConcurrency)); err != nil {
			return fmt.Errorf("set up queue %s: %w", q.Name, err)
		}
	}
	return nil
}

// submitOptions are the queue and key of job k; none without --queues and --keys.
func (sys *benchSystem) submitOptions(k int) []client.SubmitOption {
	if len(sys.queues) == 0 && sys.keys == 0 {
		return nil
	}
	var opts []client.SubmitOption
	if len(sys.queues) > 0 {
		opts = append(opts, client.Queue(sys.queues[k%len(sys.queues)]))
	}
	if sys.keys > 0 {
		opts = append(opts, client.ConcurrencyKey("key-"+strconv.Itoa(k%sys.keys)))
	}
	return opts
}
