package coordinator

import (
	"context"
	"encoding/base64"
	"errors"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// The store seam. The lifecycle (what happens to jobs and workers) decides in memory
// and talks to one jobStore for everything durable: the term that fences its writes,
// the writes of job records, reading a record back, what recovery reads and the
// checkpoint of the job index. How records are written is the store's, chosen once
// when it opens: JetStream pipelined (a single server), JetStream in atomic batches
// (group commit: a cluster, or a server syncing every write), either wrapped so that a
// write counts only once Config.SyncJobs made it durable (syncedStore), or in memory
// (memStore, for tests that need no NATS). Every implementation keeps the same
// contract (jobstore_contract_test.go):
//
//   - a write creates a record (rev 0) only while the store's term is the last one
//     claimed, and updates it only as a CAS on the revision the last write returned;
//     a write refused either way reports ErrFenced (DESIGN invariant 3);
//   - a job has at most one write in flight (the lifecycle's committer sees to it), and
//     a write's outcome reaches the sink exactly once: written with its revision once
//     durable, or failed/gaveUp with the reason; a write that was sent and may have
//     been stored is failed only with ErrOutcomeUnknown, unless the store read it back
//     (readAt) and found it absent after a copy was refused outright (outcome.go);
//   - a finishing write of a job with an idempotency key stores the key's binding
//     before the record, so a crash between the two leaves the key known.

// jobStore makes job records durable and reads them back (see above).
type jobStore interface {
	// open readies the store and claims a new leadership term, whose writes are the
	// only ones that land from then on.
	open(ctx context.Context) error
	// terms returns the term open claimed and the one before it.
	terms() (prev, term uint64)
	// start begins writing for sink; the store's goroutines run until ctx ends, and
	// wait returns once they have.
	start(ctx context.Context, sink storeSink) error
	wait()
	// write hands ws to the store, whose outcomes reach the sink; it may block while
	// the store is busy (back pressure), and returns false once ctx ended (the writes
	// not taken then failed with ctx's error).
	write(ctx context.Context, ws []pendingWrite) bool
	// read returns the record last stored under job id; errNoRecord if none is.
	read(ctx context.Context, id string) ([]byte, error)
	// readAt is read with the revision the record was stored at: what a write whose
	// outcome is unknown is read back with (outcome.go). In a cluster it reads from
	// the stream's leader, which has every write it acknowledged.
	readAt(ctx context.Context, id string) ([]byte, uint64, error)
	// load reads what recovery needs: every kept job's head, the active ones' records
	// whole.
	load(ctx context.Context) (*loaded, error)
	// bindings hands keep the idempotency bindings recovery must see: those left in
	// the old keys bucket (moved into the store when keep keeps them) and, with every,
	// all stored.
	bindings(ctx context.Context, every bool, keep func(key string, value []byte) bool) error
	// checkpoint stores the job index that index returns as of the store's last write, for
	// the next term's load; it returns the jobs written.
	checkpoint(ctx context.Context, index func() []head) (int, error)
	// health is whether the store takes writes (storage.go).
	health() *storeHealth
	// controls are the durable settings beside the jobs (controls.go); open first.
	controls() controlStore
	// writeAll stores new records and a control all or nothing (writeall.go).
	writeAll(ctx context.Context, ctl control, ws []pendingWrite) (uint64, error)
}

// storeSink hears how the writes handed to a jobStore ended: the lifecycle, which owns
// the jobs. Its methods take the lifecycle's lock themselves.
type storeSink interface {
	// written records j's write of version, durable at revision rev.
	written(j *job, rev, version uint64)
	// writtenAll records several durable writes at once, as written would one by one:
	// the assignments their waiters send leave together (outbox.go), so that a burst
	// of acknowledgements reaches a worker in one tell where it takes batches.
	writtenAll(ws []ackedWrite)
	// fail ends j's waiters with err: its write is not known to be durable.
	fail(j *job, err error)
	// giveUp ends j's waiters with err and forgets j if it was never stored.
	giveUp(j *job, err error)
	// refuseWaitingCreates gives up, with err, the jobs waiting for their first write.
	refuseWaitingCreates(err error)
	// fence stops the coordinator: someone else wrote the state it owned.
	fence(err error)

	// doubts keeps which jobs have a write sent whose outcome is unknown (outcome.go).
	doubts() writeDoubts
}

// writeDoubts keeps which jobs have a write sent whose outcome is unknown (the
// scheduler's writeQueue): doubt marks the jobs of ws so; inDoubt returns those of ws
// that are; settle clears it, the store having shown that none of ws can land any more
// (written clears it too); hurry answers the submitters of the uncertain creates among
// ws "Outcome unknown" now, for cause, since the store's fault outlasts their requests.
type writeDoubts interface {
	doubt(ws []pendingWrite)
	inDoubt(ws []pendingWrite) []pendingWrite
	settle(ws []pendingWrite)
	hurry(ws []pendingWrite, cause string)
}

// loaded is what recovery reads from the store.
type loaded struct {
	heads   []head   // every kept job: finished ones whole, active ones (or older records) by id
	records []stored // the records of the active jobs (and of heads with no state), whole
	lastSeq uint64   // the store's last sequence: bounds every job sequence ever given
	// binds are the bindings written since the checkpoint loaded, when one was.
	binds          []storedBinding
	fromCheckpoint bool
	// coldAfter: SCHEDULED jobs due after it (Unix milliseconds) were not read whole
	// (readWhole, delayed.go).
	coldAfter int64
}

// stored is a record read whole, with its revision.
type stored struct {
	protocol.Record
	rev     uint64
	expires int64 // a finished record's end of retention (protocol.HeaderExpires); 0: none known
}

// storedBinding is an idempotency binding read from the store: its key and value.
type storedBinding struct {
	key   string
	value []byte
}

// errNoRecord: no record is stored under that job id (never, or expired, or deleted).
var errNoRecord = errors.New("no record stored")

// ErrFenced means a write found the state changed by someone else: another coordinator
// leads, or a write whose outcome was unknown landed after all. This coordinator must
// stop and a fresh one recover from KV (DESIGN invariant 3).
var ErrFenced = errors.New("coordinator fenced: job state was written by another coordinator")

// pendingWrite is one write of a job's record, taken under the lifecycle's lock.
type pendingWrite struct {
	j       *job
	id, key string
	data    []byte
	rev     uint64 // the revision written over; 0 creates
	version uint64
	seq     uint64
	state   protocol.State
	ttl     time.Duration // how long a finished record is kept; 0 for ever
	expires int64         // when the job's retention ends, Unix milliseconds; with ttl
	runAt   int64         // a SCHEDULED job's due time, Unix milliseconds (protocol.HeaderRunAt)
	queue   string        // a SCHEDULED job's queue, DefaultQueue included (protocol.HeaderQueue)
	bind    binding
	// uniqueUntil is the end of the unique window a COMPLETED job holds, or the due
	// time of a SCHEDULED job that holds a unique key (unique.go's heldUntil), 0 if
	// none: a header of the record (protocol.HeaderUniqueUntil).
	uniqueUntil int64
}

// binds reports whether w stores its idempotency key's binding before its record: a
// finishing write (with the record's TTL, or none when jobs are kept for ever), since
// recovery reads a finished job by its headers only; and a SCHEDULED job's (for ever,
// until its finishing write), since one due far ahead is not read whole (delayed.go).
// An active job's key is in its record.
func (w *pendingWrite) binds() bool {
	return w.key != "" && (w.ttl > 0 || w.runAt != 0 || w.state.Terminal())
}

// binding is an idempotency key's value in protocol.JobsBucket, under bindingKey(key).
type binding struct {
	JobID       string `json:"jobId"`
	Fingerprint string `json:"fingerprint"`
}

// bindingKey encodes an idempotency key (any non-empty string) as a valid KV key.
func bindingKey(key string) string {
	return protocol.KeyPrefix + base64.RawURLEncoding.EncodeToString([]byte(key))
}
