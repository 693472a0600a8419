package system

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// coordinatorIDFile names the file in the embedded store directory that keeps its
// coordinator's identity across restarts.
const coordinatorIDFile = "jobbus-coordinator-id"

// storedCoordinatorID returns the coordinator identity kept in dir, creating it on
// first use.
func storedCoordinatorID(dir string) (string, error) {
	path := filepath.Join(dir, coordinatorIDFile)
	data, err := os.ReadFile(path)
	if id := strings.TrimSpace(string(data)); err == nil && id != "" {
		return id, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("read coordinator id: %w", err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := "coordinator-" + hex.EncodeToString(b[:])
	if err := os.WriteFile(path, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("keep coordinator id in %s: %w", dir, err)
	}
	return id, nil
}
