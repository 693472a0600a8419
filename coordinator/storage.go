package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// JetStream's error codes for a write refused for want of room (nats-server's
// errors.json): the account's or the server's storage limit, or a stream's.
const (
	codeAccountResourcesExceeded jetstream.ErrorCode = 10002
	codeInsufficientResources    jetstream.ErrorCode = 10023
	codeStorageResourcesExceeded jetstream.ErrorCode = 10047
	codeStreamStoreFailed        jetstream.ErrorCode = 10077 // with "maximum bytes exceeded"
)

// StoreFull reports a write JetStream refused because its store has no room.
func StoreFull(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case codeAccountResourcesExceeded, codeInsufficientResources, codeStorageResourcesExceeded:
		return true
	case codeStreamStoreFailed:
		return strings.Contains(apiErr.Description, "maximum bytes exceeded")
	}
	return false
}

// storeHealth remembers whether the store takes job writes: whether the last job write
// found it full (JetStream's limit), what Config.StoreFault says, and whether writes go
// unanswered while JetStream answers (stalled). Writes set and clear it from the
// writer goroutines, without the scheduler's mu.
type storeHealth struct {
	full    atomic.Pointer[string] // JetStream's words, while full
	fault   func() error           // Config.StoreFault; nil: none
	stalled atomic.Pointer[error]  // set by storeFailure, cleared by a write that succeeds
	// unsynced is Config.SyncJobs's failure, until a sync succeeds (durable.go).
	unsynced atomic.Pointer[error]
	since    atomic.Int64 // when full or stalled was last set, or probed: Unix nanoseconds
	said     atomic.Int64 // when storeFailure last logged, Unix nanoseconds
	// answers reports whether the store answers requests other than writes (the jobs
	// stream's information comes back); nil until the store is open. Set by open while
	// the lease's renewals may already read it.
	answers atomic.Pointer[func(ctx context.Context) bool]
}

// storeProbeEvery is how often, while the store is full or stalled, one submission is
// let through to try the store: without it, a coordinator with no accepted job left to
// write would refuse for ever, since only a write that succeeds lifts the refusal.
const storeProbeEvery = time.Second

// noteWrite records the outcome of one job write.
func (h *storeHealth) noteWrite(err error) {
	switch {
	case err == nil:
		if h.full.Load() != nil {
			h.full.Store(nil)
		}
		if h.stalled.Load() != nil {
			h.stalled.Store(nil)
		}
	case StoreFull(err):
		var apiErr *jetstream.APIError
		errors.As(err, &apiErr)
		desc := apiErr.Description
		h.full.Store(&desc)
		h.since.Store(time.Now().UnixNano())
	}
}

// stall marks the store stalled with err.
func (h *storeHealth) stall(err error) {
	h.stalled.Store(&err)
	h.since.Store(time.Now().UnixNano())
}

// synced notes a sync that succeeded.
func (h *storeHealth) synced() {
	if h.unsynced.Load() != nil {
		h.unsynced.Store(nil)
	}
}

// failing returns the store's failure other than JetStream's limit, nil if none is
// known.
func (h *storeHealth) failing() error {
	if err := h.watched(); err != nil {
		return err
	}
	if p := h.stalled.Load(); p != nil {
		return *p
	}
	return nil
}

// watched returns the failure a watcher reports, Config.StoreFault's or a failed
// sync's, nil if none: no submission need be let through to learn when it ends.
func (h *storeHealth) watched() error {
	if h.fault != nil {
		if err := h.fault(); err != nil {
			return err
		}
	}
	if p := h.unsynced.Load(); p != nil {
		return *p
	}
	return nil
}

// refusal is the ERROR a submission gets at once while the store is full or failing,
// nil otherwise. A job already being written keeps being retried (running jobs are not
// lost), so the first write that succeeds again, when space returns, lifts it; and
// every storeProbeEvery one submission goes through to try (what is watched needs no
// such try; for a failed sync, one let through would only wait for the next).
func (h *storeHealth) refusal() *protocol.Error {
	if err := h.watched(); err != nil {
		return storeFaultError(err)
	}
	desc, stalled := h.full.Load(), h.stalled.Load()
	if desc == nil && stalled == nil || h.probeDue() {
		return nil
	}
	if desc != nil {
		return storeFullError(*desc)
	}
	return storeFaultError(*stalled)
}

// probeDue reports, to one caller at a time, that the store has not been tried for
// storeProbeEvery.
func (h *storeHealth) probeDue() bool {
	last, now := h.since.Load(), time.Now().UnixNano()
	return now-last >= int64(storeProbeEvery) && h.since.CompareAndSwap(last, now)
}

func storeFullError(desc string) *protocol.Error {
	return &protocol.Error{Message: "job not stored: the job store is full (JetStream: " + desc +
		"); jobs already accepted are kept and go on, new ones are refused until space is freed " +
		"or the limit raised (jobbus serve --nats-max-store, or the NATS server's max_file_store)"}
}

// errStoreStalled: a job write got no answer while JetStream answered: what nats-server
// does once a write to a stream's files failed (a full disk, a read-only file system).
var errStoreStalled = errors.New("a job write got no answer while the NATS server's JetStream answers: its disk is likely full or read-only")

// storeFaultError is the ERROR of a submission refused, or not stored, because the
// store cannot be written.
func storeFaultError(err error) *protocol.Error {
	what, until := storeFaultWords(err)
	return &protocol.Error{Message: "job not stored: " + what + " (" + err.Error() +
		"); jobs already accepted are kept and go on, new ones are refused until " + until}
}

// storeFaultWords says what is wrong with the store, and until when submissions are
// refused.
func storeFaultWords(err error) (what, until string) {
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return "the job store is full", "space is freed on its disk"
	case errors.Is(err, syscall.EROFS):
		return "the job store is read-only", "its file system is writable again"
	case errors.Is(err, errStoreStalled):
		return "the job store takes no writes", "the NATS server writes again: free space or make its disk writable, " +
			"then restart it (nats-server does not write to a stream whose disk write failed until it restarts)"
	}
	return "the job store cannot be written", "it can be written again"
}

// storeFailure returns what a failed job write says about the store: err itself when
// JetStream refused it for want of room, the store's known failure (Config.StoreFault,
// or writes stalled), nil when the store is not the cause. A write that timed out
// while the jobs stream still answers is the sign of a stream nats-server stopped
// writing (filestore's write error): the store is then marked stalled until a write
// succeeds, and the operator told what to do, every 30 s while it lasts.
func (s *jsStore) storeFailure(ctx context.Context, err error) error {
	if StoreFull(err) {
		return err
	}
	f := s.storage.failing()
	if f == nil && s.storage.writesStalled(ctx, err) {
		f = errStoreStalled
		s.storage.stall(f)
	}
	if f == nil {
		return nil
	}
	f = &storeFault{f}
	s.sink.refuseWaitingCreates(f)
	if now := time.Now().UnixNano(); now-s.storage.said.Load() >= int64(30*time.Second) {
		s.storage.said.Store(now)
		what, until := storeFaultWords(f)
		s.log.Error(what+": accepted jobs are kept in memory and written when it recovers; new submissions are refused until "+until,
			"err", f)
	}
	return f
}

// gaveUpCreate gives up w, a create that failed with err, when err says the store
// cannot take it (storeFailure), so that its submitter hears why now instead of after
// another write's timeout; it reports whether it did.
func (s *jsStore) gaveUpCreate(ctx context.Context, w pendingWrite, err error) bool {
	if w.rev != 0 {
		return false
	}
	ferr := s.storeFailure(ctx, err)
	if ferr == nil {
		return false
	}
	s.sink.giveUp(w.j, ferr)
	return true
}

// writesStalled reports a write that timed out while the store answers otherwise.
func (h *storeHealth) writesStalled(ctx context.Context, err error) bool {
	answers := h.answers.Load()
	if !timedOut(err) || answers == nil {
		return false
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return (*answers)(ictx)
}

// leaseWriteFailed notes a lease renewal that failed with err: one that timed out
// while JetStream answers stalls the store as a job write would, so that the answer of
// a coordinator whose lease lapsed names the cause (notLeader).
func (h *storeHealth) leaseWriteFailed(ctx context.Context, err error) {
	if h.failing() == nil && h.writesStalled(ctx, err) {
		h.stall(errStoreStalled)
	}
}

// storeFault marks an error as the store's failure, for notStored.
type storeFault struct{ error }

func (f *storeFault) Unwrap() error { return f.error }

// timedOut reports a request that got no answer in time.
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// notStored is the ERROR of a submission whose record could not be written.
func notStored(id string, err error) *protocol.Error {
	var apiErr *jetstream.APIError
	if StoreFull(err) && errors.As(err, &apiErr) {
		return storeFullError(apiErr.Description)
	}
	if f := (*storeFault)(nil); errors.As(err, &f) {
		return storeFaultError(f.error)
	}
	return &protocol.Error{Message: fmt.Sprintf("job %s was not stored: %v", id, err)}
}
