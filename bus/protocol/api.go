package protocol

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// The client API on NATS: a micro service whose endpoints take and give the client-port
// JSON of PROTOCOL.md, so the bridge forwards frames unchanged and `nats req` works.
const (
	// ServiceName is the micro service's name (`nats micro ls`).
	ServiceName = "jobbus"
	// APIPrefix is the subject prefix of the endpoints: jobbus.api.submit, .status,
	// .list, .workers and .cancel.
	APIPrefix = "jobbus.api"
)

// Endpoint is one endpoint of the client API: its name (the last subject token) and
// the one request type it serves.
type Endpoint struct {
	Name    string
	Request Type
	// Token, when set, is the subject's tail after APIPrefix instead of Name (a micro
	// endpoint name has no dots: "workflow_submit" serves jobbus.api.workflow.submit).
	Token string
}

// Subject is the NATS subject the endpoint listens on.
func (e Endpoint) Subject() string {
	if e.Token != "" {
		return APIPrefix + "." + e.Token
	}
	return APIPrefix + "." + e.Name
}

// Endpoints lists the client API: each request type of the client port, and the
// endpoint that serves it. It is the one list of client requests; the rest derive
// from it.
var Endpoints = []Endpoint{
	{Name: "submit", Request: TypeSubmitJob},
	{Name: "submit_many", Token: "submit.many", Request: TypeSubmitJobs}, // native: submissions in batches (submits.go)
	{Name: "status", Request: TypeGetJobStatus},
	{Name: "list", Request: TypeListJobs},
	{Name: "workers", Request: TypeListWorkers},
	{Name: "cancel", Request: TypeCancelJob},
	{Name: "types", Request: TypeListTaskTypes}, // native: the task type catalogue
	// native: workflows and batches (workflow.go)
	{Name: "workflow_submit", Token: "workflow.submit", Request: TypeSubmitWorkflow},
	{Name: "workflow_status", Token: "workflow.status", Request: TypeGetWorkflow},
	{Name: "workflow_cancel", Token: "workflow.cancel", Request: TypeCancelWorkflow},
	{Name: "workflow_retry", Token: "workflow.retry", Request: TypeRetryWorkflow},
	// native: the schedules (schedules.go)
	{Name: "schedule_add", Token: "schedule.add", Request: TypeAddSchedule},
	{Name: "schedule_list", Token: "schedule.list", Request: TypeListSchedules},
	{Name: "schedule_pause", Token: "schedule.pause", Request: TypePauseSchedule},
	{Name: "schedule_resume", Token: "schedule.resume", Request: TypeResumeSchedule},
	{Name: "schedule_remove", Token: "schedule.remove", Request: TypeRemoveSchedule},
	{Name: "schedule_trigger", Token: "schedule.trigger", Request: TypeTriggerSchedule},
	// native: named queues (queues.go)
	{Name: "queue_list", Token: "queue.list", Request: TypeListQueues},
	{Name: "queue_pause", Token: "queue.pause", Request: TypePauseQueue},
	{Name: "queue_resume", Token: "queue.resume", Request: TypeResumeQueue},
	{Name: "queue_set", Token: "queue.set", Request: TypeSetQueue},
	// native: rate limits (limits.go)
	{Name: "limit_set", Token: "limit.set", Request: TypeSetLimit},
	{Name: "limit_list", Token: "limit.list", Request: TypeListLimits},
	{Name: "limit_remove", Token: "limit.remove", Request: TypeRemoveLimit},
}

// EndpointFor returns the endpoint that serves request type t; ok is false for a type
// that is not a client request.
func EndpointFor(t Type) (e Endpoint, ok bool) {
	for _, e := range Endpoints {
		if e.Request == t {
			return e, true
		}
	}
	return Endpoint{}, false
}

// SubjectFor returns the subject of the endpoint that serves request type t, as
// EndpointFor(t).Subject() would, without building it: a client asks for it on every
// request. ok is false for a type that is not a client request.
func SubjectFor(t Type) (subject string, ok bool) {
	subject, ok = endpointSubjects.subject[t]
	return subject, ok
}

// RequestOn returns the request type the client API endpoint on subject serves; ok is
// false for a subject that is none.
func RequestOn(subject string) (t Type, ok bool) {
	t, ok = endpointSubjects.request[subject]
	return t, ok
}

// endpointSubjects is Endpoints' subjects both ways, made once.
var endpointSubjects = func() (x struct {
	subject map[Type]string
	request map[string]Type
}) {
	x.subject = make(map[Type]string, len(Endpoints))
	x.request = make(map[string]Type, len(Endpoints))
	for _, e := range Endpoints {
		x.subject[e.Request] = e.Subject()
		x.request[e.Subject()] = e.Request
	}
	return x
}()

// IsClientRequest reports whether t is a request of the client port.
func IsClientRequest(t Type) bool {
	_, ok := EndpointFor(t)
	return ok
}

// Bucket names in JetStream KV.
const (
	// JobsBucket holds all durable job state, in one stream so that one atomic batch
	// can carry any set of changes (DESIGN: one write path, fenced):
	//   - a job's Record under the job's id (a single token: a UUID);
	//   - an idempotency binding under KeyPrefix + base64url(key) (IsRecordKey tells
	//     the two apart: watch "*" sees records only);
	//   - the leadership term under TermKey;
	//   - the coordinator's durable settings (queues, limits, schedules, workflows,
	//     batches) under ControlPrefix + kind + "." + name.
	JobsBucket = "JOBS"
	// KeysBucket held idempotency bindings before they moved into JobsBucket; a
	// coordinator moves what it finds there and removes the bucket.
	KeysBucket = "JOB_KEYS"
	// LeaderBucket holds the coordinators' leader lease.
	LeaderBucket = "JOBBUS_LEADER"
	// CheckpointBucket is an object store holding the coordinator's checkpoint of its
	// job index, which a restart reads instead of every record's headers.
	CheckpointBucket = "JOBBUS_CHECKPOINT"
	// TaskTypesBucket (tasktypes.go) is the catalogue of task types.
)

// LeaderSubject is where a coordinator announces, once it serves as leader, its term
// (LeaderAnnouncement): workers and bridges heartbeat at once, and register again with
// the new leader, instead of at their next heartbeat.
const LeaderSubject = "jobbus.leader"

// HeaderTimeout is an optional header of a client API request: how long, in
// milliseconds, the requester waits for the reply. The coordinator answers a little
// within it; a submission or cancel whose write is not confirmed by then is answered
// "Outcome unknown" (OutcomeUnknown) while the write goes on. Without it the
// coordinator's own limit applies (4 s: clients wait 5 s by default).
const HeaderTimeout = "Jobbus-Timeout-Millis"

// LeaderAnnouncement is the body published on LeaderSubject.
type LeaderAnnouncement struct {
	Coordinator string `json:"coordinator"`
	Term        uint64 `json:"term"`
}

// Keys in JobsBucket besides the records.
const (
	// KeyPrefix starts the key of an idempotency binding.
	KeyPrefix = "k."
	// TermKey holds the current leadership term (a decimal number and the
	// coordinator's id); a new leader writes it, CAS on the one it read, before it
	// reads any job, and every later create of its term checks that it is still the
	// last message of TermKey.
	TermKey = "_jobbus.term"
	// ControlPrefix starts the key of a durable setting: "c.queue.critical",
	// "c.schedule.nightly". Record scans ("*") never see them.
	ControlPrefix = "c."
)

// MaxJobID bounds a job id: every job's is a UUID (36 bytes), and a longer string is
// no job's. As a KV key it would make a subject, and one beyond NATS's 4 KiB control
// line makes the server close the connection that sends it.
const MaxJobID = 256

// IsRecordKey reports whether a JobsBucket key names a job record. A client's job id
// is looked up in the bucket only when it does: neither another key nor a string too
// long to be one.
func IsRecordKey(key string) bool {
	return key != "" && len(key) <= MaxJobID && !strings.Contains(key, ".")
}

// Size limits. A frame, a reply and a NATS message hold at most MaxMessage bytes; the
// submission bounds keep every job record well inside it: the payload as submitted,
// the idempotency key, and the result and error texts a worker reports (longer ones
// are cut by the coordinator, marked so).
const (
	MaxMessage      = 1 << 20
	MaxPayloadBytes = 768 << 10
	MaxKeyBytes     = 1024
	MaxTextBytes    = 64 << 10
)

// ClipText bounds a worker's result or error text to MaxTextBytes, cut at the start of
// a character and marked "... (truncated)". The coordinator keeps no longer text; a
// native worker cuts its own before it sends them, since a text longer than a NATS
// message would never reach the coordinator at all.
func ClipText(s string) string { return Clip(s, MaxTextBytes) }

// Clip bounds s to max bytes: longer, it is cut at the start of a character and marked
// "... (truncated)", the mark within max.
func Clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	const mark = "... (truncated)"
	return runePrefix(s, max-len(mark)) + mark
}

// runePrefix is s cut to at most n bytes, at the start of a character.
func runePrefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Bounds of a worker registration. A worker id names a NATS subject token (base64 if
// need be), so it is bounded too.
const (
	MinCapacity = 1
	MaxCapacity = 1024
	MaxWorkerID = 512
)

// Validate reports whether the registration is usable: a worker id that is not blank and
// at most MaxWorkerID bytes, and a capacity in MinCapacity..MaxCapacity. The error is the
// spec's ERROR text.
func (m *WorkerRegister) Validate() *Error {
	if strings.TrimSpace(m.WorkerID) == "" || len(m.WorkerID) > MaxWorkerID ||
		m.Capacity < MinCapacity || m.Capacity > MaxCapacity {
		return BadRegistration()
	}
	return nil
}

// CheckSubmission enforces the submission bounds that hold for every task type: the
// payload's size and the idempotency key's length. The error is the wire text.
func (m *SubmitJob) CheckSubmission() *Error {
	if len(m.Payload) > MaxPayloadBytes {
		return InvalidPayload(fmt.Sprintf("Payload exceeds %d bytes", MaxPayloadBytes))
	}
	if k := m.IdempotencyKey; k != nil && (*k == "" || len(*k) > MaxKeyBytes) {
		return &Error{Message: fmt.Sprintf("Idempotency key must be 1 to %d bytes, got %d", MaxKeyBytes, len(*k))}
	}
	return nil
}
