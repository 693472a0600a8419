package protocol

import (
	"encoding/json"
)

// The hot messages of the worker port, TASK_ASSIGN and TASK_RESULT, cross the bridge
// once per job in each direction. Decoding them with encoding/json (a validating
// pass, then a reflecting one) and encoding them again cost several per cent of the
// TCP path's CPU, for bytes that are almost always exactly what Encode writes. The
// parsers below read that one canonical layout and nothing else: the first byte that
// differs from it makes them report false, and the caller decodes with Decode, which
// judges the message (and words any error) as it always did. So they never accept
// what Decode rejects, never read a value Decode would read otherwise, and accept
// only bytes that Encode would write again unchanged.

// ParseCanonicalTaskAssign reads data when it is a TASK_ASSIGN exactly as Encode
// writes one (fields in order, compact, plain ASCII strings without escapes). Then
// Decode(data) would return the same message and Encode(m) would return data. m's
// Payload is a slice of data (nil for a null payload, as Decode leaves it). ok is
// false for anything else, which Decode must judge.
func ParseCanonicalTaskAssign(data []byte) (m TaskAssign, ok bool) {
	s := canonScan{d: data}
	if !s.lit(`{"type":"TASK_ASSIGN","jobId":`) {
		return m, false
	}
	if m.JobID, ok = s.str(); !ok || !s.lit(`,"attemptId":`) {
		return m, false
	}
	if m.AttemptID, ok = s.str(); !ok || !s.lit(`,"attemptNumber":`) {
		return m, false
	}
	if m.AttemptNumber, ok = s.uint(); !ok || !s.lit(`,"taskType":`) {
		return m, false
	}
	if m.TaskType, ok = s.str(); !ok || !s.lit(`,"payload":`) {
		return m, false
	}
	// The payload is the last member: everything up to the object's closing brace.
	end := len(data) - 1
	if end < s.i || data[end] != '}' {
		return m, false
	}
	payload := data[s.i:end:end]
	if !compactAsEncoded(payload) || !json.Valid(payload) {
		return m, false
	}
	if string(payload) != "null" {
		m.Payload = payload
	}
	return m, true
}

// ParseCanonicalTaskResult reads data when it is a TASK_RESULT exactly as Encode
// writes one (fields in order, compact, plain ASCII strings without escapes). Then
// Decode(data) would return the same message and Encode(m) would return data. ok is
// false for anything else, which Decode must judge.
func ParseCanonicalTaskResult(data []byte) (m TaskResult, ok bool) {
	s := canonScan{d: data}
	if !s.lit(`{"type":"TASK_RESULT","workerId":`) {
		return m, false
	}
	if m.WorkerID, ok = s.str(); !ok || !s.lit(`,"jobId":`) {
		return m, false
	}
	if m.JobID, ok = s.str(); !ok || !s.lit(`,"attemptId":`) {
		return m, false
	}
	if m.AttemptID, ok = s.str(); !ok || !s.lit(`,"success":`) {
		return m, false
	}
	if m.Success, ok = s.boolean(); !ok || !s.lit(`,"result":`) {
		return m, false
	}
	if m.Result, ok = s.strOrNull(); !ok || !s.lit(`,"error":`) {
		return m, false
	}
	if m.Error, ok = s.strOrNull(); !ok {
		return m, false
	}
	// permanent is written only when true (omitzero).
	m.Permanent = s.lit(`,"permanent":true`)
	return m, s.lit("}") && s.i == len(data)
}

// ParseCanonicalResultAck reads data when it is a ResultAck exactly as encoding/json
// writes one (fields in order, compact, a plain ASCII job id). Then json.Unmarshal
// would read the same. ok is false for anything else, which json.Unmarshal must judge.
func ParseCanonicalResultAck(data []byte) (ack ResultAck, ok bool) {
	s := canonScan{d: data}
	if !s.lit(`{"jobId":`) {
		return ack, false
	}
	if ack.JobID, ok = s.str(); !ok || !s.lit(`,"accepted":`) {
		return ack, false
	}
	if ack.Accepted, ok = s.boolean(); !ok {
		return ack, false
	}
	return ack, s.lit("}") && s.i == len(data)
}

// plainByte reports whether encoding/json writes c in a string as it is.
func plainByte(c byte) bool {
	return c >= 0x20 && c <= 0x7e && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
}

// canonScan reads the canonical layout of a message from d, from i on.
type canonScan struct {
	d []byte
	i int
}

// lit consumes l if the input continues with it.
func (s *canonScan) lit(l string) bool {
	if len(s.d)-s.i < len(l) || string(s.d[s.i:s.i+len(l)]) != l {
		return false
	}
	s.i += len(l)
	return true
}

// str consumes a string of plain bytes: printable ASCII that encoding/json writes as
// it is (no quote, backslash or <, >, & that it escapes). Anything else is left to
// encoding/json, which alone knows how to unescape and repair it.
func (s *canonScan) str() (string, bool) {
	if s.i >= len(s.d) || s.d[s.i] != '"' {
		return "", false
	}
	start := s.i + 1
	for j := start; j < len(s.d); j++ {
		switch c := s.d[j]; {
		case c == '"':
			s.i = j + 1
			return string(s.d[start:j]), true
		case !plainByte(c):
			return "", false
		}
	}
	return "", false
}

func (s *canonScan) strOrNull() (*string, bool) {
	if s.lit("null") {
		return nil, true
	}
	v, ok := s.str()
	if !ok {
		return nil, false
	}
	return &v, true
}

func (s *canonScan) boolean() (bool, bool) {
	switch {
	case s.lit("true"):
		return true, true
	case s.lit("false"):
		return false, true
	}
	return false, false
}

// uint consumes a non-negative integer as encoding/json writes an int: no sign, no
// leading zero, and few enough digits that it cannot overflow.
func (s *canonScan) uint() (int, bool) {
	const maxDigits = 18
	n, j := 0, s.i
	for ; j < len(s.d) && j-s.i <= maxDigits && s.d[j] >= '0' && s.d[j] <= '9'; j++ {
		n = n*10 + int(s.d[j]-'0')
	}
	switch digits := j - s.i; {
	case digits == 0, digits > maxDigits, digits > 1 && s.d[s.i] == '0':
		return 0, false
	}
	s.i = j
	return n, true
}

// compactAsEncoded reports whether the JSON value v (valid or not: the caller checks)
// is already as encoding/json writes a json.RawMessage: without whitespace between
// tokens, and without the characters it escapes for HTML (<, >, &, U+2028, U+2029).
func compactAsEncoded(v []byte) bool {
	inString, escaped := false, false
	for i, c := range v {
		switch {
		case c == '<' || c == '>' || c == '&':
			return false
		case c == 0xE2 && i+2 < len(v) && v[i+1] == 0x80 && (v[i+2] == 0xA8 || v[i+2] == 0xA9):
			return false
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return true
}
