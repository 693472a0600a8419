// Package protocol holds the job protocol's messages: every message of the worker and
// client ports of PROTOCOL.md, and the job and worker snapshots, as Go types.
//
// The JSON is the spec's, byte for byte: a "type" discriminator first, the spec's field
// names, upper-case enum names and every field written (absent values as null). The
// same bytes travel on the bridge's TCP ports and on NATS, so a frame's payload can be
// forwarded unchanged in either direction.
package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// Type is the value of a message's "type" field.
type Type string

// Message types of the worker port.
const (
	TypeWorkerRegister   Type = "WORKER_REGISTER"
	TypeWorkerRegistered Type = "WORKER_REGISTERED"
	TypeHeartbeat        Type = "HEARTBEAT"
	TypeTaskAssign       Type = "TASK_ASSIGN"
	TypeTaskCancel       Type = "TASK_CANCEL"
	TypeTaskResult       Type = "TASK_RESULT"
	TypeError            Type = "ERROR"
)

// Message types of the client port.
const (
	TypeSubmitJob      Type = "SUBMIT_JOB"
	TypeJobSubmitted   Type = "JOB_SUBMITTED"
	TypeSubmitRejected Type = "SUBMIT_REJECTED"
	TypeGetJobStatus   Type = "GET_JOB_STATUS"
	TypeJobStatus      Type = "JOB_STATUS"
	TypeListJobs       Type = "LIST_JOBS"
	TypeJobList        Type = "JOB_LIST"
	TypeListWorkers    Type = "LIST_WORKERS"
	TypeWorkerList     Type = "WORKER_LIST"
	TypeCancelJob      Type = "CANCEL_JOB"
	TypeJobCancel      Type = "JOB_CANCEL"
	// TypeListTaskTypes and TypeTaskTypeList are native extensions (the task type
	// catalogue); spec peers never send them.
	TypeListTaskTypes Type = "LIST_TASK_TYPES"
	TypeTaskTypeList  Type = "TASK_TYPE_LIST"
	// The schedules (schedules.go) are native extensions too.
	TypeAddSchedule     Type = "ADD_SCHEDULE"
	TypeListSchedules   Type = "LIST_SCHEDULES"
	TypePauseSchedule   Type = "PAUSE_SCHEDULE"
	TypeResumeSchedule  Type = "RESUME_SCHEDULE"
	TypeRemoveSchedule  Type = "REMOVE_SCHEDULE"
	TypeTriggerSchedule Type = "TRIGGER_SCHEDULE"
	TypeScheduleInfo    Type = "SCHEDULE_INFO"
	TypeScheduleList    Type = "SCHEDULE_LIST"
)

// Message is any message of the protocol.
type Message interface {
	MessageType() Type
	json.Marshaler // the type first, then the fields
}

// Sentinel decoding errors; every error Decode returns wraps ErrMalformed.
var (
	ErrMalformed   = errors.New("malformed message")
	ErrUnknownType = fmt.Errorf("%w: unknown type", ErrMalformed)
)

// newMessage maps a type to a fresh value of its Go type.
var newMessage = map[Type]func() Message{
	TypeWorkerRegister:    func() Message { return new(WorkerRegister) },
	TypeWorkerRegistered:  func() Message { return new(WorkerRegistered) },
	TypeHeartbeat:         func() Message { return new(Heartbeat) },
	TypeTaskAssign:        func() Message { return new(TaskAssign) },
	TypeTaskCancel:        func() Message { return new(TaskCancel) },
	TypeTaskResult:        func() Message { return new(TaskResult) },
	TypeError:             func() Message { return new(Error) },
	TypeSubmitJob:         func() Message { return new(SubmitJob) },
	TypeJobSubmitted:      func() Message { return new(JobSubmitted) },
	TypeSubmitRejected:    func() Message { return new(SubmitRejected) },
	TypeGetJobStatus:      func() Message { return new(GetJobStatus) },
	TypeJobStatus:         func() Message { return new(JobStatus) },
	TypeListJobs:          func() Message { return new(ListJobs) },
	TypeJobList:           func() Message { return new(JobList) },
	TypeListWorkers:       func() Message { return new(ListWorkers) },
	TypeWorkerList:        func() Message { return new(WorkerList) },
	TypeCancelJob:         func() Message { return new(CancelJob) },
	TypeJobCancel:         func() Message { return new(JobCancel) },
	TypeListTaskTypes:     func() Message { return new(ListTaskTypes) },
	TypeTaskTypeList:      func() Message { return new(TaskTypeList) },
	TypeSubmitWorkflow:    func() Message { return new(SubmitWorkflow) },
	TypeWorkflowSubmitted: func() Message { return new(WorkflowSubmitted) },
	TypeGetWorkflow:       func() Message { return new(GetWorkflow) },
	TypeWorkflowStatus:    func() Message { return new(WorkflowStatus) },
	TypeCancelWorkflow:    func() Message { return new(CancelWorkflow) },
	TypeWorkflowCancelled: func() Message { return new(WorkflowCancelled) },
	TypeRetryWorkflow:     func() Message { return new(RetryWorkflow) },
	TypeWorkflowRetried:   func() Message { return new(WorkflowRetried) },
	TypeAddSchedule:       func() Message { return new(AddSchedule) },
	TypeListSchedules:     func() Message { return new(ListSchedules) },
	TypePauseSchedule:     func() Message { return new(PauseSchedule) },
	TypeResumeSchedule:    func() Message { return new(ResumeSchedule) },
	TypeRemoveSchedule:    func() Message { return new(RemoveSchedule) },
	TypeTriggerSchedule:   func() Message { return new(TriggerSchedule) },
	TypeScheduleInfo:      func() Message { return new(ScheduleInfo) },
	TypeScheduleList:      func() Message { return new(ScheduleList) },
	TypeListQueues:        func() Message { return new(ListQueues) },
	TypeQueueList:         func() Message { return new(QueueList) },
	TypePauseQueue:        func() Message { return new(PauseQueue) },
	TypeResumeQueue:       func() Message { return new(ResumeQueue) },
	TypeSetQueue:          func() Message { return new(SetQueue) },
	TypeQueueUpdated:      func() Message { return new(QueueUpdated) },
	TypeSetLimit:          func() Message { return new(SetLimit) },
	TypeRemoveLimit:       func() Message { return new(RemoveLimit) },
	TypeListLimits:        func() Message { return new(ListLimits) },
	TypeLimitList:         func() Message { return new(LimitList) },
	TypeLimitRemoved:      func() Message { return new(LimitRemoved) },
	TypeSubmitJobs:        func() Message { return new(SubmitJobs) },
	TypeJobsSubmitted:     func() Message { return new(JobsSubmitted) },
}

// PeekType returns the "type" of a JSON message without decoding the rest: the first
// member when it is "type" (as jobbus and the spec write messages), else the last
// member named "type", as written ("Type" is another member). Decode uses the same
// rule, so the two always agree.
func PeekType(data []byte) (Type, error) {
	if t, ok := leadingType(data); ok {
		return t, nil
	}
	var env struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(withoutFoldedMembers(data, typeMember), &env); err != nil {
		return "", fmt.Errorf("%w: %s", ErrMalformed, describe(err))
	}
	if env.Type == nil {
		return "", fmt.Errorf("%w: missing field 'type'", ErrMalformed)
	}
	t := Type(*env.Type)
	if _, ok := newMessage[t]; !ok {
		return "", fmt.Errorf("%w %q", ErrUnknownType, t)
	}
	return t, nil
}

// Decode parses one message. It rejects non-JSON, a missing or unknown type and wrong
// field types (an integer given as a string or as 1.5); it ignores unknown fields and
// leaves absent optional fields nil. Member names match as written: "JobId" is an
// unknown field, not jobId (members.go), unlike in json.Unmarshal and DecodeJSON.
func Decode(data []byte) (Message, error) {
	m, _, err := DecodeExact(data)
	return m, err
}

// DecodeExact is Decode that also reports whether data is exactly what Encode(m)
// writes, so that it may be forwarded as it is instead of encoded again. It says so
// for the hot messages (TASK_ASSIGN, TASK_RESULT, SUBMIT_JOB, JOB_SUBMITTED) as
// jobbus writes them, which its scanner reads in the same pass (scan.go); for other
// messages exact is false.
func DecodeExact(data []byte) (m Message, exact bool, err error) {
	if m, exact, ok := scanHot(data); ok {
		normalize(m)
		return m, exact, nil
	}
	t, err := PeekType(data)
	if err != nil {
		return nil, false, err
	}
	m = newMessage[t]()
	ok := false
	if s, hot := m.(interface{ scan([]byte) (exact, ok bool) }); hot {
		exact, ok = s.scan(data)
	}
	if !ok {
		if err := json.Unmarshal(withoutFoldedMembers(data, fieldNames[t]), m); err != nil {
			return nil, false, fmt.Errorf("%w: %s: %s", ErrMalformed, t, describe(err))
		}
	}
	normalize(m)
	return m, exact, nil
}

// leadingType reads the type of a message whose first member is "type" with a known
// plain string value, as every jobbus encoder and the spec's examples write it, without
// a second pass over the JSON; the one pass json.Unmarshal then makes checks the rest.
func leadingType(data []byte) (Type, bool) {
	const key = `"type"`
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return "", false
	}
	i = skipSpace(data, i+1)
	if len(data)-i < len(key) || string(data[i:i+len(key)]) != key {
		return "", false
	}
	i = skipSpace(data, i+len(key))
	if i >= len(data) || data[i] != ':' {
		return "", false
	}
	i = skipSpace(data, i+1)
	if i >= len(data) || data[i] != '"' {
		return "", false
	}
	end := i + 1
	for end < len(data) && data[end] != '"' && data[end] != '\\' {
		end++
	}
	if end >= len(data) || data[end] != '"' {
		return "", false
	}
	t, known := typeNames[string(data[i+1:end])] // indexing with string(bytes) allocates nothing
	// A second "type" key would win in encoding/json (the last of duplicate keys
	// counts): leave such a message to the slow path, so that a message has the same
	// type whatever its key order, as any JSON parser in front of jobbus sees it.
	return t, known && !bytes.Contains(data[end:], []byte(key))
}

// typeNames maps each known type's name to its Type, so that reading a message's type
// returns the interned value instead of allocating a string per message.
var typeNames = func() map[string]Type {
	m := make(map[string]Type, len(newMessage))
	for t := range newMessage {
		m[string(t)] = t
	}
	return m
}()

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// DecodeAs parses data as the message type M, failing when its "type" is another one.
func DecodeAs[M any, PM interface {
	*M
	Message
}](data []byte) (*M, error) {
	m, err := Decode(data)
	if err != nil {
		return nil, err
	}
	pm, ok := m.(PM)
	if !ok {
		return nil, fmt.Errorf("%w: expected %s, got %s", ErrMalformed, PM(new(M)).MessageType(), m.MessageType())
	}
	return (*M)(pm), nil
}

// AsError returns the ERROR data holds, and false for any other message or none. The
// type is read first (PeekType), so a reply that is no ERROR costs no decoding.
func AsError(data []byte) (*Error, bool) {
	if t, err := PeekType(data); err != nil || t != TypeError {
		return nil, false
	}
	e, err := DecodeAs[Error](data)
	return e, err == nil
}

// Encode writes m as JSON with its "type" first.
func Encode(m Message) ([]byte, error) {
	// A nil Message or nil pointer would marshal to null, which no peer accepts.
	if v := reflect.ValueOf(m); !v.IsValid() || v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, errors.New("encode: nil message")
	}
	// Every message writes itself (see encode); json.Marshal would only check and copy
	// what it wrote.
	return m.MarshalJSON()
}

// encode is what each message's MarshalJSON calls: the type, then the fields of v (a
// method-free copy of the message, so MarshalJSON does not recurse).
func encode(t Type, v any) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", t, err)
	}
	var buf bytes.Buffer
	buf.Grow(len(body) + len(t) + 12)
	buf.WriteString(`{"type":"`)
	buf.WriteString(string(t))
	buf.WriteByte('"')
	if len(body) > 2 {
		buf.WriteByte(',')
		buf.Write(body[1:])
	} else {
		buf.WriteByte('}')
	}
	return buf.Bytes(), nil
}

// describe turns encoding/json's errors into a sentence that names the field.
func describe(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return fmt.Sprintf("field '%s' must be %s, got %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
		}
		return fmt.Sprintf("expected a JSON object, got %s", te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at offset %d: %v", se.Offset, se)
	}
	return err.Error()
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int32", "int64", "uint", "uint32", "uint64":
		return "an integer"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice":
		return "an array"
	default:
		return "an object"
	}
}
