package protocol

import (
	"fmt"
	"strings"
)

// The wire texts of PROTOCOL.md and DESIGN.md, produced here only, so the bridge and the
// NATS API cannot drift apart.

const malformedPrefix = "Malformed request: "

// MalformedRequest is the best-effort ERROR text for an undecodable request. The TCP
// ports close the connection after it.
func MalformedRequest(cause error) *Error {
	return &Error{Message: malformedPrefix + cause.Error()}
}

// ClosesConnection reports whether e is the ERROR after which a TCP port closes the
// connection: a malformed request.
func (e *Error) ClosesConnection() bool { return strings.HasPrefix(e.Message, malformedPrefix) }

// InvalidPayload is the ERROR text for a payload that fails its task's validation.
func InvalidPayload(detail string) *Error {
	return &Error{Message: "Invalid payload: " + detail}
}

// AfterAnyEndHint ends ParentEnded's text. It names the wire's field; a client that
// calls it otherwise (the CLI's --after-any-end) replaces it with its own.
const AfterAnyEndHint = " (submit with afterAnyEnd to run it anyway)"

// ParentEnded is the ERROR text refusing a job after a parent that already ended st
// (FAILED, CANCELLED), which it would wait for in vain.
func ParentEnded(parentID string, st State) *Error {
	return InvalidPayload(fmt.Sprintf("parent job %s ended %s, so a job after it would never run", parentID, st) + AfterAnyEndHint)
}

// UnknownJob is the ERROR text for a job id the coordinator does not know. An id
// longer than any job's (MaxJobID) is named cut short: echoed whole, an id of most of a
// frame would make the reply (its body and, over NATS, its error header each hold the
// text) larger than a NATS message, and the reply would be lost.
func UnknownJob(jobID string) *Error {
	if len(jobID) <= MaxJobID {
		return &Error{Message: "Unknown job: " + jobID}
	}
	return &Error{Message: fmt.Sprintf("Unknown job: %s... (%d bytes)", runePrefix(jobID, MaxJobID), len(jobID))}
}

// UnknownTaskType is the ERROR text for a task type no worker can run.
func UnknownTaskType(taskType string) *Error {
	return &Error{Message: fmt.Sprintf("Unknown task type: %s", taskType)}
}

// IdempotencyConflict is the ERROR text for a key reused with a different submission.
func IdempotencyConflict(key, jobID string) *Error {
	return &Error{Message: fmt.Sprintf("Idempotency key '%s' is already bound to a different submission (job %s)", key, jobID)}
}

// FirstMessageMustRegister is the worker port's ERROR before registration.
func FirstMessageMustRegister() *Error {
	return &Error{Message: "First message must be WORKER_REGISTER"}
}

// BadRegistration is the ERROR text for a registration without a usable id or capacity.
func BadRegistration() *Error {
	return &Error{Message: "Registration requires a worker id and capacity in 1..1024"}
}

// UnexpectedType is the ERROR text for a message that is legal only on the other port.
func UnexpectedType(t Type, port string) *Error {
	return &Error{Message: fmt.Sprintf("Unexpected message type %s on the %s port", t, port)}
}

// WrongEndpoint is the ERROR text for a client request sent to another request type's
// API subject.
func WrongEndpoint(t Type, subject string) *Error {
	return &Error{Message: fmt.Sprintf("Unexpected message type %s on %s", t, subject)}
}

// NoSubmissions is the ERROR for a SUBMIT_JOBS that carries no submission.
func NoSubmissions() *Error {
	return &Error{Message: "Invalid batch: a SUBMIT_JOBS must carry at least one submission"}
}

// TooManySubmissions is the ERROR for a SUBMIT_JOBS of n submissions, more than
// MaxSubmissions.
func TooManySubmissions(n int) *Error {
	return &Error{Message: fmt.Sprintf("Invalid batch: a SUBMIT_JOBS of %d submissions exceeds the limit of %d", n, MaxSubmissions)}
}

// AtCapacity is the reason of a SUBMIT_REJECTED.
func AtCapacity(active, limit int) *SubmitRejected {
	return &SubmitRejected{
		Reason:      fmt.Sprintf("coordinator at capacity: %d active jobs (limit %d)", active, limit),
		ActiveCount: active,
		Limit:       limit,
		Retryable:   true,
	}
}

// UnavailablePrefix starts the bridge's ERROR when no coordinator answered it, so a
// client can tell "nobody is serving" from "your request was wrong".
const UnavailablePrefix = "coordinator unavailable: "

// CoordinatorUnavailable is the bridge's ERROR for a request no coordinator answered.
func CoordinatorUnavailable(detail string) *Error {
	return &Error{Message: UnavailablePrefix + detail}
}

// CheckRequestID reports whether rid is a usable request id; the error is the wire text.
func CheckRequestID(rid string) *Error {
	if rid == "" || len(rid) > MaxRequestID {
		return &Error{Message: fmt.Sprintf("Request id (header %s) must be 1 to %d bytes, got %d", HeaderRequestID, MaxRequestID, len(rid))}
	}
	return nil
}

// RequestIDReused is the ERROR for a request id sent again with a different
// submission than the one that created its job.
func RequestIDReused(rid, jobID string) *Error {
	return &Error{Message: fmt.Sprintf("Request id '%s' was already used for a different submission (job %s)", rid, jobID)}
}

// OutcomeUnknownPrefix starts the ERROR of a request whose write the coordinator could
// not confirm or rule out within the request's time (DESIGN invariant 8): the job, or
// its cancel, may be stored, and then it runs (or stays cancelled). Every other ERROR
// and every SUBMIT_REJECTED means nothing was stored. A client must not resend such a
// submission as a new one (PROTOCOL.md: an ambiguous failure is never retryable): it
// asks for the named job's status, or resends with the same idempotency key.
const OutcomeUnknownPrefix = "Outcome unknown: "

// NotServingPrefix begins the ERROR of a coordinator that is not serving (fenced,
// stopping, or its lease not certainly held; micro code 503). It acted on nothing it
// had not already begun, and acknowledges nothing: a submission so answered alone is
// sent again under its request id (natsreq), and one so answered inside a SUBMIT_JOBS
// may have been stored: its outcome is unknown.
const NotServingPrefix = "coordinator is not serving"

// OutcomeOpen reports whether e leaves its submission's outcome open: its coordinator
// stopped serving (NotServingPrefix) or could not tell yet (OutcomeUnknownPrefix)
// whether the job was stored. Sent again under its request id, marked as a send again
// (HeaderRequestTry), the submission hears which: its job, or that none was made.
func (e *Error) OutcomeOpen() bool {
	return strings.HasPrefix(e.Message, NotServingPrefix) || strings.HasPrefix(e.Message, OutcomeUnknownPrefix)
}

// OutcomeUnknown is the ERROR of a request about job jobID whose write may or may not
// be stored: what names the request ("submission", "cancel"), cause says why the
// coordinator could not tell.
func OutcomeUnknown(what, jobID, cause string) *Error {
	advice := "do not submit it again as a new job: ask for the job's status, or submit again with the same idempotency key"
	if !strings.Contains(what, "submission") { // a batch of them too
		advice = "ask for the job's status, or send it again (a repeat changes nothing more)"
	}
	return &Error{Message: OutcomeUnknownPrefix + "job " + jobID + ": the " + what +
		" may or may not be stored (" + cause + "); " + advice}
}

// OutcomeUnknownGroup is the "Outcome unknown" ERROR of a workflow's or batch's
// submission (what: "workflow w", "batch b") or retry ("retry of workflow w", "retry of batch b") whose
// write was not confirmed, said by the coordinator, which writes it again until it
// knows, or by a client left unanswered (client.OutcomeWorkflow reads it back). A
// submission sent again is safe; a retry sent again is not (it is refused while the
// steps it ran again run, and runs again those that failed by then).
func OutcomeUnknownGroup(what, cause string) *Error {
	again := "sending the same again is safe, and answers its jobs once they are stored"
	if strings.HasPrefix(what, "retry") {
		again = "its status shows its steps run again once it is stored: ask for it before retrying again, " +
			"which runs again the steps that failed or were cancelled by then"
	}
	return &Error{Message: OutcomeUnknownPrefix + what + " may or may not be stored (" + cause +
		"); the coordinator writes it again until it knows, and runs its jobs once it is stored: " + again}
}

// OutcomeUnknownGroupCancel is the "Outcome unknown" ERROR of a cancel of the workflow
// or batch (kind) id: the cancels of its steps may or may not be stored. It names the
// group, not a job (client.OutcomeWorkflow reads it back).
func OutcomeUnknownGroupCancel(kind, id, cause string) *Error {
	return &Error{Message: OutcomeUnknownPrefix + kind + " " + id + " may or may not be cancelled (" + cause +
		"); ask for its status, or send the cancel again (a repeat changes nothing more)"}
}

// OutcomeUnknownSetting is the "Outcome unknown" ERROR of a command that changes a
// setting (what: "schedule s", "the settings of queue q", "the limit of queue q") whose
// write was not confirmed, said by the coordinator or by a client left unanswered: it may or may not be done ("stored", "removed"), cause says why
// that is not known. The same command sent again changes nothing more (a setting
// written again to the same value; a removal again is refused as unknown). It names
// no job or workflow.
func OutcomeUnknownSetting(what, done, cause string) *Error {
	return &Error{Message: OutcomeUnknownPrefix + what + " may or may not be " + done + " (" + cause +
		"); the coordinator takes on what the store settles, and sending the command again is safe and answers what is stored"}
}

// OutcomeUnknownTrigger is the "Outcome unknown" ERROR of a trigger of schedule name:
// its job may or may not be submitted. Not safe to send again: each trigger submits
// its job under a key of its own.
func OutcomeUnknownTrigger(name, cause string) *Error {
	return &Error{Message: OutcomeUnknownPrefix + "schedule " + name + " may or may not have submitted a job (" + cause +
		"); a trigger sent again submits another: the schedule's last run and job (Schedules) show whether this one did"}
}

// OutcomeUnknownUnanswered is the "Outcome unknown" ERROR of a submission or cancel
// (what) that went to a coordinator and got no answer, said by whoever forwarded it
// (the bridge): it names no job, since none was named back.
func OutcomeUnknownUnanswered(what, cause string) *Error {
	e := OutcomeUnknown(what, "", cause)
	e.Message = OutcomeUnknownPrefix + strings.TrimPrefix(e.Message, OutcomeUnknownPrefix+"job : ")
	return e
}

// OutcomeUnknownJob returns the job an "Outcome unknown" ERROR text names, and whether
// msg is one.
func OutcomeUnknownJob(msg string) (jobID string, ok bool) {
	rest, ok := strings.CutPrefix(msg, OutcomeUnknownPrefix+"job ")
	if !ok {
		return "", false
	}
	id, _, found := strings.Cut(rest, ":")
	return id, found && id != ""
}

// ReplyTooLargePrefix begins the ERROR that stands for an answer larger than a NATS
// message on the coordinator's server, which NATS would not carry.
const ReplyTooLargePrefix = "Reply too large: "

// ReplyTooLarge is the ERROR that stands for an answer of type t and size bytes, more
// than the max a NATS message holds. A request that changed nothing (a status, a
// list) is answered it as is: nothing was stored, as with every ERROR. One whose write
// was done (done) is answered it as an "Outcome unknown": the caller cannot see what
// it changed, and asks for it.
func ReplyTooLarge(t Type, size int, max int64, done bool) *Error {
	why := fmt.Sprintf("the %s answering this request would be %d bytes, more than the %d a NATS message holds on this server", t, size, max)
	if done {
		return &Error{Message: OutcomeUnknownPrefix + "the request was carried out, but its reply is too large: " + why +
			"; ask for what it changed (the job's or the workflow's status)"}
	}
	return &Error{Message: ReplyTooLargePrefix + why}
}
