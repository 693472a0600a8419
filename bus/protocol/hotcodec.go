package protocol

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The hot messages (TASK_ASSIGN and TASK_RESULT with the result's ResultAck, on the
// worker side; SUBMIT_JOB and JOB_SUBMITTED on the client side) pass here for every
// job, several times over. encoding/json spends most of its time on them in
// reflection and in a validating pass before the decoding one; these codecs read and
// write them in one pass without either.
//
// Each fast path takes only the frames it can read exactly as encoding/json would (no
// \u escapes in strings, no escapes in keys, no key that matches a field only
// case-insensitively, integers as plain literals, valid JSON throughout) and leaves
// every other frame to encoding/json itself: the outcome, error texts included, is
// always encoding/json's.
// FuzzHotDecode and FuzzHotEncode hold them to that.

// DecodeJSON decodes a whole payload into m exactly as json.Unmarshal(data, m) does
// (bus.Decoder): the same fields set, the same errors.
func (m *TaskAssign) DecodeJSON(data []byte) error {
	if m.Payload != nil { // json.Unmarshal would reuse its array
		return json.Unmarshal(data, m)
	}
	t := *m
	ok := eachMember(data, func(k, v []byte) bool {
		switch string(k) {
		case "jobId":
			return decString(v, &t.JobID)
		case "attemptId":
			return decString(v, &t.AttemptID)
		case "attemptNumber":
			return decInt(v, &t.AttemptNumber)
		case "taskType":
			return decString(v, &t.TaskType)
		case "payload":
			t.Payload = append(json.RawMessage(nil), v...)
			return true
		}
		return ignorable(k, "jobId", "attemptId", "attemptNumber", "taskType", "payload")
	})
	if !ok {
		return json.Unmarshal(data, m)
	}
	*m = t
	return nil
}

// DecodeJSON decodes a whole payload into m exactly as json.Unmarshal(data, m) does.
func (m *TaskResult) DecodeJSON(data []byte) error {
	if m.Result != nil || m.Error != nil { // json.Unmarshal would write through them
		return json.Unmarshal(data, m)
	}
	t := *m
	ok := eachMember(data, func(k, v []byte) bool {
		switch string(k) {
		case "workerId":
			return decString(v, &t.WorkerID)
		case "jobId":
			return decString(v, &t.JobID)
		case "attemptId":
			return decString(v, &t.AttemptID)
		case "success":
			return decBool(v, &t.Success)
		case "result":
			return decStringPtr(v, &t.Result)
		case "error":
			return decStringPtr(v, &t.Error)
		case "permanent":
			return decBool(v, &t.Permanent)
		}
		return ignorable(k, "workerId", "jobId", "attemptId", "success", "result", "error", "permanent")
	})
	if !ok {
		return json.Unmarshal(data, m)
	}
	*m = t
	return nil
}

// DecodeJSON decodes a whole payload into m exactly as json.Unmarshal(data, m) does.
func (m *ResultAck) DecodeJSON(data []byte) error {
	t := *m
	ok := eachMember(data, func(k, v []byte) bool {
		switch string(k) {
		case "jobId":
			return decString(v, &t.JobID)
		case "accepted":
			return decBool(v, &t.Accepted)
		}
		return ignorable(k, "jobId", "accepted")
	})
	if !ok {
		return json.Unmarshal(data, m)
	}
	*m = t
	return nil
}

// DecodeJSON decodes a whole payload into m exactly as json.Unmarshal(data, m) does.
func (m *SubmitJob) DecodeJSON(data []byte) error {
	if m.Payload != nil || m.IdempotencyKey != nil || m.Priority != nil {
		return json.Unmarshal(data, m)
	}
	t := *m
	ok := eachMember(data, func(k, v []byte) bool {
		switch string(k) {
		case "taskType":
			return decString(v, &t.TaskType)
		case "payload":
			t.Payload = append(json.RawMessage(nil), v...)
			return true
		case "maxAttempts":
			return decInt(v, &t.MaxAttempts)
		case "idempotencyKey":
			return decStringPtr(v, &t.IdempotencyKey)
		case "priority":
			return decPriority(v, &t.Priority)
		}
		return ignorable(k, "taskType", "payload", "maxAttempts", "idempotencyKey", "priority")
	})
	if !ok {
		return json.Unmarshal(data, m)
	}
	*m = t
	return nil
}

// DecodeJSON decodes a whole payload into m exactly as json.Unmarshal(data, m) does.
func (m *JobSubmitted) DecodeJSON(data []byte) error {
	t := *m
	ok := eachMember(data, func(k, v []byte) bool {
		if string(k) == "jobId" {
			return decString(v, &t.JobID)
		}
		return ignorable(k, "jobId")
	})
	if !ok {
		return json.Unmarshal(data, m)
	}
	*m = t
	return nil
}

// eachMember walks data, which must be one JSON object and nothing else but
// whitespace, calling member with each member's key (without quotes) and value (its
// exact JSON text, valid). It reports false, having stopped, when data is anything
// else, when a key has escapes, or when member returns false.
func eachMember(data []byte, member func(key, value []byte) bool) bool {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return skipSpace(data, i+1) == len(data)
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return false
		}
		kend := i + 1
		for kend < len(data) && data[kend] != '"' && data[kend] != '\\' && data[kend] >= 0x20 {
			kend++
		}
		if kend >= len(data) || data[kend] != '"' {
			return false // an escape, a control character, or the end
		}
		key := data[i+1 : kend]
		i = skipSpace(data, kend+1)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i = skipSpace(data, i+1)
		end := skipValue(data, i, 0, true)
		if end < 0 || !member(key, data[i:end]) {
			return false
		}
		i = skipSpace(data, end)
		if i >= len(data) {
			return false
		}
		switch data[i] {
		case '}':
			return skipSpace(data, i+1) == len(data)
		case ',':
			i = skipSpace(data, i+1)
		default:
			return false
		}
	}
}

// ignorable reports whether encoding/json ignores key, given the struct's field names:
// it matches a field case-insensitively too (with Unicode folding, hence plain ASCII
// only here).
func ignorable(key []byte, fields ...string) bool {
	for _, c := range key {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	for _, f := range fields {
		if len(f) == len(key) && strings.EqualFold(f, string(key)) {
			return false
		}
	}
	return true
}

// maxFastDepth bounds the nesting skipValue follows; deeper values (encoding/json takes
// up to 10,000 levels) go the slow way.
const maxFastDepth = 64

// skipValue returns the index just past the JSON value that starts at b[i], or -1 if
// there is none there that it accepts: it accepts only valid JSON (what encoding/json's
// scanner accepts), nested at most maxFastDepth deep. With space false it also refuses
// what json.Marshal would change in a json.RawMessage: whitespace between tokens, and
// the characters it escapes (<, >, &, U+2028, U+2029).
func skipValue(b []byte, i, depth int, space bool) int {
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '"':
		return skipString(b, i, space)
	case c == '{' || c == '[':
		if depth >= maxFastDepth {
			return -1
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		if i = skipWS(b, i+1, space); i < 0 {
			return -1
		}
		if i < len(b) && b[i] == closer {
			return i + 1
		}
		for {
			if c == '{' {
				if i >= len(b) || b[i] != '"' {
					return -1
				}
				if i = skipString(b, i, space); i < 0 {
					return -1
				}
				if i = skipWS(b, i, space); i < 0 || i >= len(b) || b[i] != ':' {
					return -1
				}
				if i = skipWS(b, i+1, space); i < 0 {
					return -1
				}
			}
			if i = skipValue(b, i, depth+1, space); i < 0 {
				return -1
			}
			if i = skipWS(b, i, space); i < 0 || i >= len(b) {
				return -1
			}
			switch b[i] {
			case closer:
				return i + 1
			case ',':
				if i = skipWS(b, i+1, space); i < 0 {
					return -1
				}
			default:
				return -1
			}
		}
	case c == '-' || c >= '0' && c <= '9':
		return skipNumber(b, i)
	case c == 't':
		return skipLiteral(b, i, "true")
	case c == 'f':
		return skipLiteral(b, i, "false")
	case c == 'n':
		return skipLiteral(b, i, "null")
	}
	return -1
}

// skipWS skips whitespace, which without space is refused (-1).
func skipWS(b []byte, i int, space bool) int {
	j := skipSpace(b, i)
	if j != i && !space {
		return -1
	}
	return j
}

func skipLiteral(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// skipString returns the index past the string starting at b[i] (a quote), or -1.
func skipString(b []byte, i int, space bool) int {
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			if i++; i >= len(b) {
				return -1
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(b)-i <= 4 || !isHex(b[i+1]) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) {
					return -1
				}
				i += 4
			default:
				return -1
			}
		case space:
		case c == '<' || c == '>' || c == '&':
			return -1
		case c == 0xE2 && len(b)-i > 2 && b[i+1] == 0x80 && (b[i+2] == 0xA8 || b[i+2] == 0xA9):
			return -1
		}
	}
	return -1
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// skipNumber returns the index past the JSON number at b[i], or -1.
func skipNumber(b []byte, i int) int {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// plainString returns the content of the JSON string v as encoding/json reads it, when
// it has no \u escapes and is valid UTF-8 (encoding/json replaces invalid bytes and
// lone surrogates; those strings are left to it). v is valid JSON.
func plainString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	s := v[1 : len(v)-1]
	ascii, escaped := true, false
	for _, c := range s {
		switch {
		case c == '\\':
			escaped = true
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(s) {
		return "", false
	}
	if !escaped {
		return string(s), true
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
		case '"', '\\', '/':
			b.WriteByte(s[i])
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		default: // \u
			return "", false
		}
	}
	return b.String(), true
}

// The dec functions read a valid JSON value into a field as encoding/json would, or
// report false for a value they leave to it (which then also reports any error).
// null leaves a non-pointer field as it is and sets a pointer nil, as encoding/json does.

func decString(v []byte, dst *string) bool {
	if string(v) == "null" {
		return true
	}
	s, ok := plainString(v)
	if ok {
		*dst = s
	}
	return ok
}

func decStringPtr(v []byte, dst **string) bool {
	if string(v) == "null" {
		*dst = nil
		return true
	}
	s, ok := plainString(v)
	if ok {
		*dst = &s
	}
	return ok
}

func decBool(v []byte, dst *bool) bool {
	switch string(v) {
	case "null":
	case "true":
		*dst = true
	case "false":
		*dst = false
	default:
		return false
	}
	return true
}

// decInt reads an integer literal of up to 18 digits (which fit any int64); other
// numbers, 1.0 and 1e3 among them, are encoding/json's to accept or refuse.
func decInt(v []byte, dst *int) bool {
	if string(v) == "null" {
		return true
	}
	digits := v
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return false
	}
	n := 0
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	if strconv.IntSize == 32 && int64(n) != int64(int32(n)) {
		return false
	}
	if len(digits) < len(v) {
		n = -n
	}
	*dst = n
	return true
}

func decPriority(v []byte, dst **Priority) bool {
	if string(v) == "null" {
		*dst = nil
		return true
	}
	var p Priority
	switch string(v) {
	case `"HIGH"`:
		p = PriorityHigh
	case `"NORMAL"`:
		p = PriorityNormal
	case `"LOW"`:
		p = PriorityLow
	default:
		return false
	}
	*dst = &p
	return true
}

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
	return append(b, '}'), ok1 && ok2 && ok3 && ok4
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
	return append(b, '}'), ok1 && ok2 && ok3 && ok4 && ok5
}

func (m *SubmitJob) appendFast(b []byte) ([]byte, bool) {
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
	return append(b, '}'), ok1 && ok2 && ok3 && ok4
}

func (m *JobSubmitted) appendFast(b []byte) ([]byte, bool) {
	b = append(b, `{"type":"JOB_SUBMITTED","jobId":`...)
	b, ok := appendString(b, m.JobID)
	return append(b, '}'), ok
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
	if skipValue(p, 0, 0, false) != len(p) {
		return b, false
	}
	return append(b, p...), true
}

func (m TaskAssign) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 128+len(m.JobID)+len(m.AttemptID)+len(m.TaskType)+len(m.Payload))
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
	return append(b, '}'), ok && okPayload
}
