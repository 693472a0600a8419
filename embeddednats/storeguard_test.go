package embeddednats

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

// TestClassifyStoreWriteError: a stream's write failure keeps nats-server's words,
// and takes its kind and errno from what the probe next to the store met.
func TestClassifyStoreWriteError(t *testing.T) {
	t.Parallel()
	const prefix = "JetStream stream '$G > KV_JOBS' write error: write /d/jetstream/$G/streams/KV_JOBS/msgs/1.blk: "
	for _, tc := range []struct {
		msg   string
		probe error
		kind  error
		errno error
	}{
		{prefix + "no space left on device", &pathError{syscall.ENOSPC}, ErrStoreFull, syscall.ENOSPC},
		{prefix + "read-only file system", &pathError{syscall.EROFS}, ErrStoreReadOnly, syscall.EROFS},
		{prefix + "input/output error", &pathError{syscall.EIO}, ErrStoreFailed, nil},
		{prefix + "no space left on device", nil, ErrStoreFailed, nil}, // room again: restarted at once
	} {
		err := classify(errors.New(tc.msg), tc.probe)
		if !errors.Is(err, tc.kind) || tc.errno != nil && !errors.Is(err, tc.errno) {
			t.Errorf("classify(%q, %v) = %v, want %v and %v", tc.msg, tc.probe, err, tc.kind, tc.errno)
		}
		if err.Error() != tc.msg {
			t.Errorf("classify(%q) says %q, want nats-server's words", tc.msg, err)
		}
	}
	off := fmt.Errorf("%w: JetStream is off after a failure to write its store", ErrStoreFailed)
	if err := classify(off, &pathError{syscall.ENOSPC}); err != off {
		t.Errorf("classify(JetStream off) = %v, want it as it is", err)
	}
	if e := storeUnwritable("/d", &pathError{syscall.EROFS}); !errors.Is(e, ErrStoreReadOnly) || !errors.Is(e, syscall.EROFS) {
		t.Errorf("storeUnwritable(EROFS) = %v", e)
	}
	if e := storeUnwritable("/d", &pathError{syscall.ENOSPC}); !errors.Is(e, ErrStoreFull) {
		t.Errorf("storeUnwritable(ENOSPC) = %v", e)
	}
	if e := storeUnwritable("/d", &pathError{syscall.EACCES}); e != nil {
		t.Errorf("storeUnwritable(EACCES) = %v, want nil", e)
	}
}

type pathError struct{ errno syscall.Errno }

func (e *pathError) Error() string { return "open /d/x: " + e.errno.Error() }
func (e *pathError) Unwrap() error { return e.errno }
