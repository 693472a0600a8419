package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// bench's --limit and --limit-burst set a rate limit on the bench's task type before
// the run: to measure what a limit costs dispatch (a rate the run cannot reach), or to
// watch one hold the run back.

// checkBenchLimit refuses a --limit that cannot be read, before anything starts.
func checkBenchLimit(c *cli.Context) error {
	if !c.IsSet("limit") {
		return nil
	}
	req := protocol.SetLimit{Scope: protocol.LimitTaskType, Name: benchTask, Rate: c.String("limit"), Burst: c.Int64("limit-burst")}
	if _, _, err := req.Check(); err != nil {
		return usageError("--limit: %v", err)
	}
	return nil
}

// setBenchLimit sets --limit on the task type the bench submits, if given.
func setBenchLimit(ctx context.Context, c *cli.Context, sys *benchSystem) error {
	if !c.IsSet("limit") {
		return nil
	}
	if len(sys.clients) == 0 {
		return errors.New("--limit: no client")
	}
	_, err := sys.clients[0].SetLimit(ctx, client.ForTaskType(sys.taskType), c.String("limit"), c.Int64("limit-burst"))
	if err != nil {
		return fmt.Errorf("--limit: %w", err)
	}
	return nil
}
