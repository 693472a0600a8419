package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
)

// SubmitOutcome is how a submission ended, for an Observer.
type SubmitOutcome string

// Submission outcomes.
const (
	SubmitAccepted  SubmitOutcome = "accepted"  // a new job was stored
	SubmitRejected  SubmitOutcome = "rejected"  // at capacity (SUBMIT_REJECTED)
	SubmitInvalid   SubmitOutcome = "invalid"   // payload, task type or key refused
	SubmitDuplicate SubmitOutcome = "duplicate" // idempotency key bound: the same job, or a conflict
	SubmitFailed    SubmitOutcome = "failed"    // not stored: fenced, or the write failed
	SubmitUnknown   SubmitOutcome = "unknown"   // answered "Outcome unknown": may or may not be stored
)

// JobChange is one state change of a job as the coordinator decided it (in memory; the
// write that makes it durable follows).
type JobChange struct {
	TaskType string
	From, To protocol.State // From is "" for a new job
	Attempts int            // including the one just started, when To is RUNNING
	Created  time.Time      // submission time
	At       time.Time      // when the change was decided
}

// Observer sees what a coordinator does, for metrics. Its methods are called with the
// coordinator's lock held (except Submitted for a stored job and Stored for a failed
// write): they must be quick and must not call the coordinator back.
type Observer interface {
	// Submitted is called once per submission.
	Submitted(outcome SubmitOutcome)
	// JobChanged is called on every state change, recovery's included.
	JobChanged(JobChange)
	// DeadlineExpired is called when an attempt overran the task timeout.
	DeadlineExpired(taskType string)
	// Stored is called after each job write to KV, with its latency; terminal is true
	// for the write that stored the job's final state, writes then being how many
	// writes this coordinator spent on the job.
	Stored(took time.Duration, err error, terminal bool, writes int)
	// Synced is called after each fsync of the jobs stream (Config.SyncJobs), with how
	// long it took and how many job writes it made durable (0 when it failed).
	Synced(took time.Duration, writes int, err error)
}

// Stats is a snapshot of what a coordinator holds.
type Stats struct {
	Jobs    map[protocol.State]int // jobs in memory by state
	Workers []protocol.Worker      // live workers by id
	Bus     bus.Stats              // the coordinator's bus node
	Serving bool                   // neither fenced nor closed
	Queues  []protocol.QueueInfo   // the named queues by name (queueapi.go)
}

// Stats returns a snapshot of the coordinator's jobs, workers and bus counters. It
// counts every job it holds: call it at scrape intervals, not per request.
func (c *Coordinator) Stats() Stats {
	s := Stats{Workers: c.sched.reg.workerList(), Jobs: c.sched.jobCounts(), Queues: c.sched.queueList()}
	var serving bool
	s.Bus, serving = c.api.stats()
	s.Serving = serving && c.sched.fencedBy() == nil
	return s
}

// submitted reports a submission's outcome. Called with the scheduler's mu held, or before taking it.
func (o *observer) submitted(outcome SubmitOutcome) {
	if obs := o.obs; obs != nil {
		obs.Submitted(outcome)
	}
}

func outcomeOf(err error) SubmitOutcome {
	switch {
	case errors.Is(err, ErrOutcomeUnknown):
		return SubmitUnknown
	case err != nil:
		return SubmitFailed
	}
	return SubmitAccepted
}

// submitUnknown counts a submission answered "Outcome unknown" because its reply was
// due first; what names the request.
func (o *observer) submitUnknown(what string) {
	if what == "submission" {
		o.submitted(SubmitUnknown)
	}
}

// changed reports j's state change since it was last reported, if any. Called with
// the scheduler's mu held, from markDirty, which every change goes through, once it has stamped the
// record's update time: the change's time, to the millisecond the record keeps.
func (o *observer) changed(j *job) {
	if j.seen == j.rec.State {
		return
	}
	from := j.seen
	j.seen = j.rec.State
	if obs := o.obs; obs != nil {
		obs.JobChanged(JobChange{TaskType: j.rec.TaskType, From: from, To: j.rec.State, Attempts: j.rec.Attempts,
			Created: time.UnixMilli(j.rec.CreatedAt), At: time.UnixMilli(j.rec.UpdatedAt)})
	}
}

// deadline reports an attempt of j that overran. Called with the scheduler's mu held.
func (o *observer) deadline(j *job) {
	if obs := o.obs; obs != nil {
		obs.DeadlineExpired(j.rec.TaskType)
	}
}

// written reports the durable write of j's version. Called with the scheduler's mu held.
func (o *observer) written(j *job, version uint64) {
	obs := o.obs
	if obs == nil {
		return
	}
	j.writes++
	terminal := version == j.version && j.rec.State.Terminal() && !j.finished
	if terminal {
		j.finished = true
	}
	obs.Stored(j.took, nil, terminal, j.writes)
}

// observer tells the Config's Observer what the scheduler does, if there is one; each
// call is made with the scheduler's mu held, which guards the counts it keeps in jobs.
type observer struct{ obs Observer }

// ErrNoLeader means no coordinator holds the leader lease.
var ErrNoLeader = errors.New("no coordinator leads")

// Leader returns the id of the coordinator that holds the leader lease on js: one
// KV read, so a health check can tell that KV answers and someone leads.
func Leader(ctx context.Context, js jetstream.JetStream) (string, error) {
	kv, err := js.KeyValue(ctx, protocol.LeaderBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return "", fmt.Errorf("%w: bucket %s does not exist (no coordinator has run)", ErrNoLeader, protocol.LeaderBucket)
	}
	if err != nil {
		return "", fmt.Errorf("open bucket %s: %w", protocol.LeaderBucket, err)
	}
	e, err := kv.Get(ctx, leaderKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return "", ErrNoLeader
	}
	if err != nil {
		return "", fmt.Errorf("read the leader lease: %w", err)
	}
	return string(e.Value()), nil
}
