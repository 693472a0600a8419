package coordinator

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

func TestStoreFullErrors(t *testing.T) {
	t.Parallel()
	api := func(code jetstream.ErrorCode, desc string) error {
		return fmt.Errorf("publish: %w", &jetstream.APIError{Code: 503, ErrorCode: code, Description: desc})
	}
	for _, tc := range []struct {
		err  error
		full bool
	}{
		{api(10047, "insufficient storage resources available"), true},
		{api(10023, "insufficient resources"), true},
		{api(10002, "resource limits exceeded for account"), true},
		{api(10077, "maximum bytes exceeded"), true},
		{api(10077, "some other store failure"), false},
		{api(10071, "wrong last sequence: 4"), false},
		{errors.New("context deadline exceeded"), false},
		{nil, false},
	} {
		if got := StoreFull(tc.err); got != tc.full {
			t.Errorf("StoreFull(%v) = %v", tc.err, got)
		}
		msg := notStored("j1", tc.err).Message
		if tc.err != nil && tc.full != strings.HasPrefix(msg, "job not stored: the job store is full") {
			t.Errorf("notStored(%v) = %q", tc.err, msg)
		}
	}
	var h storeHealth
	if h.refusal() != nil {
		t.Fatal("refusal before any write")
	}
	h.noteWrite(api(10047, "insufficient storage resources available"))
	if e := h.refusal(); e == nil || !strings.Contains(e.Message, "(JetStream: insufficient storage resources available)") {
		t.Fatalf("refusal while full: %+v", e)
	}
	h.noteWrite(errors.New("timeout")) // not about room: the state stands
	if h.refusal() == nil {
		t.Fatal("a timeout lifted the refusal")
	}
	h.noteWrite(nil)
	if h.refusal() != nil {
		t.Fatal("refusal after a write succeeded")
	}
}

// TestStoreFaultWords: a store that cannot be written, as serve's embedded server
// reports it (a full disk, a read-only file system) or as a coordinator infers it
// (writes unanswered), is named in the ERROR a submission gets, with when it ends.
func TestStoreFaultWords(t *testing.T) {
	t.Parallel()
	const nats = "JetStream stream '$G > KV_JOBS' write error: write /s/1.blk: "
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"full disk", fmt.Errorf("%s%w", nats, syscall.ENOSPC),
			[]string{"job not stored: the job store is full (", "no space left on device", "until space is freed on its disk"}},
		{"read-only", fmt.Errorf("%s%w", nats, syscall.EROFS),
			[]string{"job not stored: the job store is read-only (", "read-only file system", "until its file system is writable again"}},
		{"stalled", errStoreStalled,
			[]string{"job not stored: the job store takes no writes (", "disk is likely full or read-only", "restart"}},
		{"other", errors.New("input/output error"),
			[]string{"job not stored: the job store cannot be written (input/output error)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, e := range []*protocol.Error{storeFaultError(tc.err), notStored("j1", &storeFault{tc.err})} {
				for _, w := range tc.want {
					if !strings.Contains(e.Message, w) {
						t.Errorf("%q does not say %q", e.Message, w)
					}
				}
				if !strings.Contains(e.Message, "jobs already accepted are kept") {
					t.Errorf("%q does not say that accepted jobs are kept", e.Message)
				}
			}
		})
	}

	// A fault reported by the store's watcher refuses until it clears.
	var fault atomic.Pointer[error]
	h := storeHealth{fault: func() error {
		if p := fault.Load(); p != nil {
			return *p
		}
		return nil
	}}
	if h.refusal() != nil {
		t.Fatal("refusal with no fault")
	}
	ro := fmt.Errorf("%s%w", nats, syscall.EROFS)
	fault.Store(&ro)
	if e := h.refusal(); e == nil || !strings.Contains(e.Message, "read-only") {
		t.Fatalf("refusal with the store read-only: %+v", e)
	}
	fault.Store(nil)
	if h.refusal() != nil {
		t.Fatal("refusal after the fault cleared")
	}

	// Stalled writes refuse every submission, however long it lasts (the store is
	// tried by a write of the coordinator's own: storeProber); a write that succeeds
	// lifts the refusal.
	h.stall(errStoreStalled)
	if !h.probing() {
		t.Fatal("a stalled store is not tried")
	}
	for range 3 {
		if h.refusal() == nil {
			t.Fatal("a submission let through to a stalled store")
		}
	}
	h.noteWrite(nil)
	if h.refusal() != nil {
		t.Fatal("refusal after a write succeeded")
	}
}
