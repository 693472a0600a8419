//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd || windows)

package embeddednats

import "os"

// lockFile is a no-op where no portable file lock is wired up: a second
// server on the same directory is then not detected.
func lockFile(*os.File) error { return nil }
