//go:build unix

package cli

import (
	"runtime"
	"syscall"
	"time"
)

// processUsage returns the CPU time (user + system) this process has used so far and
// the most memory it has held resident (bytes), and whether the platform reports them.
func processUsage() (cpu time.Duration, peakRSS uint64, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	peakRSS = uint64(ru.Maxrss) * 1024 // kilobytes, except on Apple's systems
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		peakRSS = uint64(ru.Maxrss)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), peakRSS, true
}
