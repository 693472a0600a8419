package cli

import (
	"time"

	"github.com/jobbus/jobbus/embeddednats"
)

// syncFlagUsage documents --sync on serve and bench.
const syncFlagUsage = "when the embedded NATS server fsyncs JetStream writes: default (every 2 minutes, NATS's default), " +
	"always (every write before it is acknowledged: survives power loss, costs throughput), or an interval (1s, 100ms)"

// syncOptions maps --sync onto the embedded server's options.
func syncOptions(flag string) ([]embeddednats.Option, error) {
	switch flag {
	case "", "default":
		return nil, nil
	case "always":
		return []embeddednats.Option{embeddednats.WithSyncAlways(true)}, nil
	}
	d, err := time.ParseDuration(flag)
	if err != nil || d <= 0 {
		return nil, usageError("--sync must be default, always or a positive interval (1s, 100ms), got %q", flag)
	}
	return []embeddednats.Option{embeddednats.WithSyncInterval(d)}, nil
}
