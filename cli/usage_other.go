//go:build !unix

package cli

import "time"

// processUsage reports no CPU time or memory where getrusage does not exist.
func processUsage() (cpu time.Duration, peakRSS uint64, ok bool) { return 0, 0, false }
