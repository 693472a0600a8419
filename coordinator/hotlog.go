package coordinator

import (
	"context"
	"log/slog"
)

// debugging reports whether the scheduler's debug lines are written. A line on every
// job's path is written only if it is: its arguments are boxed into a slice and
// interfaces before slog looks at the level (3-4 allocations a job for two lines).
func (s *scheduler) debugging() bool {
	return s.log.Enabled(context.Background(), slog.LevelDebug)
}
