package embeddednats

import (
	"errors"
	"syscall"
	"testing"
)

func TestClassifyStoreWriteError(t *testing.T) {
	t.Parallel()
	const prefix = "JetStream stream '$G > KV_JOBS' write error: write /d/jetstream/$G/streams/KV_JOBS/msgs/1.blk: "
	for _, tc := range []struct {
		msg   string
		kind  error
		errno error
	}{
		{prefix + "no space left on device", ErrStoreFull, syscall.ENOSPC},
		{prefix + "read-only file system", ErrStoreReadOnly, syscall.EROFS},
		{prefix + "input/output error", ErrStoreFailed, nil},
	} {
		err := classify(tc.msg)
		if !errors.Is(err, tc.kind) || tc.errno != nil && !errors.Is(err, tc.errno) {
			t.Errorf("classify(%q) = %v, want %v and %v", tc.msg, err, tc.kind, tc.errno)
		}
		if err.Error() != tc.msg {
			t.Errorf("classify(%q) says %q, want nats-server's words", tc.msg, err)
		}
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
