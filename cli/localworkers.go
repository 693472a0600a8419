package cli

import (
	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
)

// checkLocalWorkers refuses counts of in-process workers, and capacities, that no
// worker can have: below min workers (serve runs none at 0; bench needs one to
// measure anything), or a capacity outside what a registration may carry.
func checkLocalWorkers(c *cli.Context, min int) error {
	if n := c.Int("workers"); n < min {
		return usageError("--workers must be %d or more, got %d", min, n)
	}
	if n := c.Int("worker-capacity"); n < protocol.MinCapacity || n > protocol.MaxCapacity {
		return usageError("--worker-capacity must be in %d..%d, got %d", protocol.MinCapacity, protocol.MaxCapacity, n)
	}
	return nil
}
