package cli

import (
	"time"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/embeddednats"
)

// syncFlagUsage documents --sync on serve and bench.
const syncFlagUsage = "when JetStream writes are fsynced: default (every 2 minutes, NATS's default), " +
	"always (every job write before anything depends on it: survives power loss; a lone server syncs writes " +
	"in groups, a cluster syncs each one), or an interval for the embedded server (1s, 100ms); see docs/performance.md"

// syncOptions maps --sync onto the embedded server's options. A lone server does not
// sync each write for --sync always: the coordinator syncs the jobs stream itself, a
// group of writes at a time (system.NATS.SyncJobs).
func syncOptions(flag string, lone bool) ([]embeddednats.Option, error) {
	switch flag {
	case "", "default":
		return nil, nil
	case "always":
		if lone {
			return nil, nil
		}
		return []embeddednats.Option{embeddednats.WithSyncAlways(true)}, nil
	}
	d, err := time.ParseDuration(flag)
	if err != nil || d <= 0 {
		return nil, usageError("--sync must be default, always or a positive interval (1s, 100ms), got %q", flag)
	}
	return []embeddednats.Option{embeddednats.WithSyncInterval(d)}, nil
}

// coordinatorSyncs reports whether --sync always is the coordinator's group fsync
// (system.NATS.SyncJobs), which it is on a lone embedded server; a cluster's server syncs each
// write itself.
func coordinatorSyncs(c *cli.Context) bool { return c.String("sync") == "always" && lone(c) }
