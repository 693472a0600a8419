package protocol

import (
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"
)

// The hot messages (scan.go) are written here in one pass, without encoding/json's
// reflection. Each fast encoder takes only the messages it can write exactly as
// encoding/json would (strings of ASCII, a payload json.Marshal copies unchanged) and
// leaves every other one to encoding/json itself: the bytes, and any error, are always
// encoding/json's. FuzzHotEncode holds them to that.

// The fast encoders write what encode writes, or report false for a message with a
// string beyond ASCII, or a payload json.Marshal would change or refuse.

func (m *TaskAssign) appendFast(b []byte) ([]byte, bool) {
	b = append(b, `{"type":"TASK_ASSIGN","jobId":`...)
	b, ok1 := appendString(b, m.JobID)
	b = append(b, `,"attemptId":`...)
	b, ok2 := appendString(b, m.AttemptID)
	b = append(b, `,"attemptNumber":`...)
	b = strconv.AppendInt(b, int64(m.AttemptNumber), 10)
	b = append(b, `,"taskType":`...)
	b, ok3 := appendString(b, m.TaskType)
	b = append(b, `,"payload":`...)
	b, ok4 := appendPayload(b, m.Payload)
	ok5, ok6 := true, true
	if m.TraceParent != "" {
		b = append(b, `,"traceparent":`...)
		b, ok5 = appendString(b, m.TraceParent)
	}
	if m.TraceState != "" {
		b = append(b, `,"tracestate":`...)
		b, ok6 = appendString(b, m.TraceState)
	}
	return append(b, '}'), ok1 && ok2 && ok3 && ok4 && ok5 && ok6
}

func (m *TaskResult) appendFast(b []byte) ([]byte, bool) {
	b = append(b, `{"type":"TASK_RESULT","workerId":`...)
	b, ok1 := appendString(b, m.WorkerID)
	b = append(b, `,"jobId":`...)
	b, ok2 := appendString(b, m.JobID)
	b = append(b, `,"attemptId":`...)
	b, ok3 := appendString(b, m.AttemptID)
	b = append(b, `,"success":`...)
	b = strconv.AppendBool(b, m.Success)
	b = append(b, `,"result":`...)
	b, ok4 := appendStringPtr(b, m.Result)
	b = append(b, `,"error":`...)
	b, ok5 := appendStringPtr(b, m.Error)
	if m.Permanent {
		b = append(b, `,"permanent":true`...)
	}
	if m.SnoozeMillis != 0 {
		b = append(b, `,"snoozeMillis":`...)
		b = strconv.AppendInt(b, m.SnoozeMillis, 10)
	}
	return append(b, '}'), ok1 && ok2 && ok3 && ok4 && ok5
}

func (m *SubmitJob) appendFast(b []byte) ([]byte, bool) {
	// A queue and a concurrency key are written here; the other extensions are
	// encoding/json's.
	if m.extendedBeyondQueue() {
		return b, false
	}
	b = append(b, `{"type":"SUBMIT_JOB","taskType":`...)
	b, ok1 := appendString(b, m.TaskType)
	b = append(b, `,"payload":`...)
	b, ok2 := appendPayload(b, m.Payload)
	b = append(b, `,"maxAttempts":`...)
	b = strconv.AppendInt(b, int64(m.MaxAttempts), 10)
	b = append(b, `,"idempotencyKey":`...)
	b, ok3 := appendStringPtr(b, m.IdempotencyKey)
	b = append(b, `,"priority":`...)
	ok4 := true
	if m.Priority == nil {
		b = append(b, "null"...)
	} else {
		b, ok4 = appendString(b, string(*m.Priority))
	}
	ok5, ok6 := true, true
	if m.Queue != "" {
		b = append(b, `,"queue":`...)
		b, ok5 = appendString(b, m.Queue)
	}
	if m.ConcurrencyKey != "" {
		b = append(b, `,"concurrencyKey":`...)
		b, ok6 = appendString(b, m.ConcurrencyKey)
	}
	return append(b, '}'), ok1 && ok2 && ok3 && ok4 && ok5 && ok6
}

func (m *JobSubmitted) appendFast(b []byte) ([]byte, bool) {
	b = append(b, `{"type":"JOB_SUBMITTED","jobId":`...)
	b, ok := appendString(b, m.JobID)
	return append(b, '}'), ok
}

// appendList writes list's elements comma-separated, each as its appendFast writes it
// or, where that cannot, as encoding/json does (marshalSlow): the batches' encoders.
func appendList[T interface{ marshalSlow() ([]byte, error) }, P interface {
	*T
	appendFast([]byte) ([]byte, bool)
}](b []byte, list []T) ([]byte, error) {
	for i := range list {
		if i > 0 {
			b = append(b, ',')
		}
		mark := len(b)
		var good bool
		if b, good = P(&list[i]).appendFast(b); !good {
			data, err := list[i].marshalSlow()
			if err != nil {
				return nil, err
			}
			b = append(b[:mark], data...)
		}
	}
	return b, nil
}

// appendString quotes s as json.Marshal does when s is ASCII; a string with other
// characters (which it may replace or escape) is left to it.
func appendString(b []byte, s string) ([]byte, bool) {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf {
			return b, false
		}
		if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default: // other control characters and <, >, &
			const hex = "0123456789abcdef"
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"'), true
}

func appendStringPtr(b []byte, s *string) ([]byte, bool) {
	if s == nil {
		return append(b, "null"...), true
	}
	return appendString(b, *s)
}

// appendPayload writes a payload that json.Marshal would copy unchanged: valid, compact,
// nothing it escapes. A nil payload is null, as MarshalJSON makes it.
func appendPayload(b []byte, p json.RawMessage) ([]byte, bool) {
	if p == nil {
		return append(b, "null"...), true
	}
	if end, exact := skipValue(p, 0, 0); end != len(p) || !exact {
		return b, false
	}
	return append(b, p...), true
}

func (m TaskAssign) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 128+len(m.JobID)+len(m.AttemptID)+len(m.TaskType)+len(m.Payload)+len(m.TraceParent)+len(m.TraceState))
	if b, ok := m.appendFast(b); ok {
		return b, nil
	}
	return m.marshalSlow()
}

func (m TaskResult) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 128+len(m.WorkerID)+len(m.JobID)+len(m.AttemptID)+strLen(m.Result)+strLen(m.Error))
	if b, ok := m.appendFast(b); ok {
		return b, nil
	}
	return m.marshalSlow()
}

func (m SubmitJob) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 128+len(m.TaskType)+len(m.Payload)+strLen(m.IdempotencyKey))
	if b, ok := m.appendFast(b); ok {
		return b, nil
	}
	return m.marshalSlow()
}

func (m JobSubmitted) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 48+len(m.JobID))
	if b, ok := m.appendFast(b); ok {
		return b, nil
	}
	return m.marshalSlow()
}

func strLen(s *string) int {
	if s == nil {
		return 0
	}
	return len(*s)
}

// AppendJSON appends the record as json.Marshal writes it, with the same errors, in
// about a third of its time: the coordinator stores a record at every transition of
// every job. It is no MarshalJSON because json.Marshal checks and compacts what a
// MarshalJSON writes, a pass that costs more than its reflective encoding of a record.
func (r *Record) AppendJSON(b []byte) ([]byte, error) {
	start := len(b)
	b = slices.Grow(b, 256+len(r.JobID)+len(r.TaskType)+len(r.Payload)+len(r.WorkerID)+len(r.AttemptID)+len(r.LastWorkerID)+
		strLen(r.Result)+strLen(r.Error)+len(r.IdempotencyKey)+len(r.Fingerprint))
	if out, ok := r.appendFast(b); ok {
		return out, nil
	}
	data, err := r.marshalSlow()
	if err != nil {
		return b[:start], err
	}
	return append(b[:start], data...), nil
}

// marshalSlow is encoding/json's encoding of the record.
func (r Record) marshalSlow() ([]byte, error) { return json.Marshal(r) }

func (r *Record) appendFast(b []byte) ([]byte, bool) {
	ok := true
	str := func(name, s string, omitEmpty bool) {
		if omitEmpty && s == "" {
			return
		}
		b = append(b, name...)
		var good bool
		b, good = appendString(b, s)
		ok = ok && good
	}
	num := func(name string, n int64, omitEmpty bool) {
		if omitEmpty && n == 0 {
			return
		}
		b = append(b, name...)
		b = strconv.AppendInt(b, n, 10)
	}
	str(`{"jobId":`, r.JobID, false)
	str(`,"taskType":`, r.TaskType, false)
	b = append(b, `,"payload":`...)
	b, okPayload := appendPayload(b, r.Payload)
	str(`,"state":`, string(r.State), false)
	num(`,"attempts":`, int64(r.Attempts), false)
	num(`,"maxAttempts":`, int64(r.MaxAttempts), false)
	str(`,"priority":`, string(r.Priority), false)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	str(`,"workerId":`, r.WorkerID, true)
	str(`,"attemptId":`, r.AttemptID, true)
	str(`,"lastWorkerId":`, r.LastWorkerID, true)
	if r.Result != nil {
		str(`,"result":`, *r.Result, false)
	}
	if r.Error != nil {
		str(`,"error":`, *r.Error, false)
	}
	num(`,"createdAtMillis":`, r.CreatedAt, false)
	num(`,"updatedAtMillis":`, r.UpdatedAt, false)
	num(`,"endedAtMillis":`, r.EndedAt, true)
	num(`,"retryAtMillis":`, r.RetryAt, true)
	str(`,"idempotencyKey":`, r.IdempotencyKey, true)
	str(`,"fingerprint":`, r.Fingerprint, true)
	str(`,"queue":`, r.Queue, true)
	num(`,"runAtMillis":`, r.RunAt, true)
	num(`,"snoozes":`, int64(r.Snoozes), true)
	str(`,"schedule":`, r.Schedule, true)
	str(`,"concurrencyKey":`, r.ConcurrencyKey, true)
	str(`,"uniqueKey":`, r.UniqueKey, true)
	num(`,"uniqueUntilMillis":`, r.UniqueUntil, true)
	if r.After != nil || r.Progress != nil { // rare: encoding/json writes them
		return b, false
	}
	if r.AfterAnyEnd {
		b = append(b, `,"afterAnyEnd":true`...)
	}
	str(`,"workflowId":`, r.WorkflowID, true)
	str(`,"step":`, r.Step, true)
	str(`,"batchId":`, r.BatchID, true)
	str(`,"traceparent":`, r.TraceParent, true)
	str(`,"tracestate":`, r.TraceState, true)
	str(`,"progressMessage":`, r.ProgressMessage, true)
	return append(b, '}'), ok && okPayload
}
