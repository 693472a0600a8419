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
	said     atomic.Int64 // when storeFailure last logged, Unix nanoseconds
	// diagnose says why a write to a stream, sent at a time, failed with an error
	// (diagnoseStream, diagnose.go); nil until the store is open (a memStore never
	// sets it). Set by open while the lease's renewals may already read it.
	diagnose atomic.Pointer[func(ctx context.Context, stream string, err error, sent time.Time) diagnosis]
	// cause is why the last job write failed (diagnose.go), for the answers that are
	// due before the store answers again; lease is why the last lease renewal failed,
	// until one succeeds.
	cause atomic.Pointer[timedDiagnosis]
	lease atomic.Pointer[diagnosis]
	// slow has the store asked why a write sent that long ago is not acknowledged
	// (slowWrite, outcome.go); nil until the store is open, and for a store that cannot
	// be asked. diagnosing: such a diagnosis runs.
	slow       atomic.Pointer[func(age time.Duration)]
	diagnosing atomic.Bool
}

// timedDiagnosis is a diagnosis and when it was made.
type timedDiagnosis struct {
	diagnosis
	at time.Time
}

// noteCause remembers why a job write failed.
func (h *storeHealth) noteCause(d diagnosis) {
	h.cause.Store(&timedDiagnosis{d, time.Now()})
}

// recentCause is why a job write failed within the last window, if one did.
func (h *storeHealth) recentCause(window time.Duration) *diagnosis {
	if t := h.cause.Load(); t != nil && time.Since(t.at) <= window {
		return &t.diagnosis
	}
	return nil
}

// storeProbeEvery is how often, while the store is full or stalled, the store is
// tried with a write of its own (storeProber): without it, a coordinator with no
// accepted job left to write would refuse for ever, since only a write that succeeds
// lifts the refusal.
const storeProbeEvery = time.Second

// probeKey is the JOBS bucket key storeProber writes: not a record's (recovery reads
// single-token keys only), and one message however often it is written (history 1).
const probeKey = "_jobbus.probe"

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
	}
}

// stall marks the store stalled with err.
func (h *storeHealth) stall(err error) {
	h.stalled.Store(&err)
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
// nil otherwise: nothing is created, so the ERROR is true. A job already being written
// keeps being retried (running jobs are not lost), so the first write that succeeds
// again, when space returns, lifts it, as does storeProber's. No submission is let
// through to try the store: its write's outcome would be unknown.
func (h *storeHealth) refusal() *protocol.Error {
	if err := h.watched(); err != nil {
		return storeFaultError(err)
	}
	desc, stalled := h.full.Load(), h.stalled.Load()
	switch {
	case desc != nil:
		return storeFullError(*desc)
	case stalled != nil:
		return storeFaultError(*stalled)
	}
	return nil
}

// probing reports whether the store is full or stalled: storeProber's to try.
func (h *storeHealth) probing() bool { return h.full.Load() != nil || h.stalled.Load() != nil }

// storeProber tries the store every storeProbeEvery while it is full or stalled, until
// ctx ends, with a small write of its own under probeKey; the first that succeeds lifts
// the refusal (noteWrite).
func (s *jsStore) storeProber(ctx context.Context) {
	t := time.NewTicker(storeProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !s.storage.probing() {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, storeProbeEvery)
		_, err := s.js.Publish(pctx, jobsSubjects+probeKey, []byte(time.Now().UTC().Format(time.RFC3339Nano)))
		cancel()
		if ctx.Err() != nil {
			return
		}
		s.storage.noteWrite(err)
		if err == nil {
			s.log.Info("the job store takes writes again: submissions are accepted")
		}
	}
}

func storeFullError(desc string) *protocol.Error {
	return &protocol.Error{Message: "job not stored: the job store is full (JetStream: " + desc +
		"); jobs already accepted are kept; new ones are refused until space is freed " +
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
		"); jobs already accepted are kept; new ones are refused until " + until}
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
// while the jobs stream's settled leader still answers is the sign of a stream
// nats-server stopped writing (filestore's write error): the store is then marked
// stalled until a write succeeds, and the operator told what to do, every 30 s while
// it lasts. A stream electing its leader, or short of its quorum, is no such sign
// (diagnose.go): its writes are retried.
func (s *jsStore) storeFailure(ctx context.Context, err error) error {
	d := s.diagnoseWrite(ctx, err)
	if StoreFull(err) {
		return err
	}
	f := s.storage.failing()
	if f == nil && d.cond == condStalled {
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
// another write's timeout; it reports whether it did. A create an earlier copy of
// which may have landed is not given up: its submitter hears "Outcome unknown" now
// (hurry), and it is written again (dropCreates).
func (s *jsStore) gaveUpCreate(ctx context.Context, w pendingWrite, err error) bool {
	ferr := s.storeFailure(ctx, err) // for every write: it diagnoses the store
	uncertain := len(s.sink.doubts().inDoubt([]pendingWrite{w})) > 0
	if uncertain && ferr != nil {
		s.oc.hurry([]pendingWrite{w}, ferr) // outcome.go
	}
	if w.rev != 0 || uncertain || ferr == nil {
		return false
	}
	s.sink.giveUp(w.j, ferr)
	return true
}

// diagnoseWrite says why a job write failed with err (diagnose.go), asking the jobs
// stream when err alone does not say and the write timed out, and remembers it for
// the answers due meanwhile.
func (s *jsStore) diagnoseWrite(ctx context.Context, err error) diagnosis {
	d, known := diagnoseError(err)
	d.stream = jobsStream
	if !known && (timedOut(err) || noResponders(err)) {
		// A write that timed out was sent about writeTimeout ago.
		d = s.storage.diagnosed(ctx, jobsStream, err, time.Now().Add(-writeTimeout-time.Second), d)
	}
	s.storage.noteCause(d)
	return d
}

// diagnosed is diagnose's answer about a write to stream sent at sent that failed with
// err, or otherwise when the store cannot be asked.
func (h *storeHealth) diagnosed(ctx context.Context, stream string, err error, sent time.Time, otherwise diagnosis) diagnosis {
	if f := h.diagnose.Load(); f != nil {
		return (*f)(ctx, stream, err, sent)
	}
	return otherwise
}

// leaseWriteFailed notes a lease renewal that failed with err, sent at sent: its
// cause (the lease's stream electing a leader, say) goes into the answer of a
// coordinator whose lease lapsed (notLeader); and a stalled stream stalls the store as
// a job write would.
func (h *storeHealth) leaseWriteFailed(ctx context.Context, err error, sent time.Time) {
	if h.diagnose.Load() == nil {
		return
	}
	d := h.diagnosed(ctx, "KV_"+protocol.LeaderBucket, err, sent, diagnosis{})
	h.lease.Store(&d)
	if h.failing() == nil && d.cond == condStalled {
		h.stall(errStoreStalled)
	}
}

// leaseRenewed forgets why a renewal failed.
func (h *storeHealth) leaseRenewed() {
	if h.lease.Load() != nil {
		h.lease.Store(nil)
	}
}

// storeCause says in words what storeFailure's err says is wrong with the store.
func storeCause(err error) string {
	var apiErr *jetstream.APIError
	if StoreFull(err) && errors.As(err, &apiErr) {
		return "the job store is full (JetStream: " + apiErr.Description + ")"
	}
	what, _ := storeFaultWords(err)
	return what + " (" + err.Error() + ")"
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
