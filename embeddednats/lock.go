package embeddednats

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// lockFileName is created in the store directory. nats-server itself takes
// no lock on its store directory (v2.15: EnableJetStream only checks that
// the directory is writable), so two servers on one directory would corrupt
// each other's streams; this lock keeps a second embedded server out. The
// OS releases it when the process dies, so a crash leaves no stale lock.
const lockFileName = "embeddednats.lock"

// errLocked is returned by the platform lockFile when another holder exists.
var errLocked = errors.New("locked")

// dirLock is an exclusive advisory lock on a store directory.
type dirLock struct{ f *os.File }

func lockDir(dir string) (*dirLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		if e := storeUnwritable(dir, err); e != nil {
			return nil, e
		}
		return nil, fmt.Errorf("embeddednats: create store directory %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		if e := storeUnwritable(dir, err); e != nil {
			return nil, e
		}
		return nil, fmt.Errorf("embeddednats: open store lock: %w", err)
	}
	if err := lockFile(f); err != nil {
		_ = f.Close()
		if errors.Is(err, errLocked) {
			return nil, &hintError{
				msg:      fmt.Sprintf("embeddednats: store directory %s is locked by another server (stop it or pass --data-dir)", dir),
				sentinel: ErrStoreLocked,
			}
		}
		return nil, fmt.Errorf("embeddednats: lock store directory %s: %w", dir, err)
	}
	return &dirLock{f: f}, nil
}

// release drops the lock. The file stays: removing it would let a third
// server lock a fresh file while a second still waits on the old one.
func (l *dirLock) release() error {
	return l.f.Close()
}

// StoreLocked reports whether another server holds the lock of the store directory
// dir at this moment, so that a command can name every obstacle to its start at once.
// A directory or lock file that does not exist, or cannot be opened, is not locked:
// Start says what is wrong with it.
func StoreLocked(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close() // releases a lock taken here
	return errors.Is(lockFile(f), errLocked)
}
