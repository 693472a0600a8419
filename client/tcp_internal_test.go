package client

import (
	"errors"
	"testing"
)

// TestWorkerPortErrorNamesTheClientPort: on the default worker port the message says
// which port clients use.
func TestWorkerPortErrorNamesTheClientPort(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"127.0.0.1:7070":      "7070 is the worker port; clients use 7071 (127.0.0.1:7071)",
		"bridge.example:7070": "7070 is the worker port; clients use 7071 (bridge.example:7071)",
		"10.0.0.1:9000":       `10.0.0.1:9000 is a worker port (it answered "First message must be WORKER_REGISTER"); clients use the bridge's client port (7071 by default)`,
	} {
		err := error(&workerPortError{addr: addr})
		if err.Error() != want || !errors.Is(err, ErrWorkerPort) {
			t.Errorf("%s: %q (Is ErrWorkerPort: %v), want %q", addr, err, errors.Is(err, ErrWorkerPort), want)
		}
	}
}
