//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package embeddednats

import (
	"errors"
	"os"
	"syscall"
)

// lockFile takes a non-blocking flock. flock locks belong to the open file,
// not the process, so two servers in one process also exclude each other.
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errLocked
	}
	return err
}
