package protocol

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The hot messages (TASK_ASSIGN and TASK_RESULT with the result's ResultAck, on the
// worker side; SUBMIT_JOB and JOB_SUBMITTED on the client side) pass here for every
// job, several times over. encoding/json spends most of its time on them in
// reflection and in a validating pass before the decoding one. The scanner below
// reads them in one pass without either, and says on the way whether the bytes are
// exactly what Encode writes for the message read: then the bridge forwards them as
// they are instead of encoding the message again (DecodeExact).
//
// It takes only the frames it can read exactly as encoding/json would (no escapes in
// keys, \u escapes in strings of ASCII only, no key that matches a field only
// case-insensitively, integers as plain literals, valid JSON throughout) and leaves
// every other frame to encoding/json itself: the outcome, error texts included, is
// always encoding/json's. Its word on exactness errs one way only: it may call bytes
// Encode would write inexact (a string beyond ASCII, a negative integer), never the
// reverse. FuzzHotDecode and FuzzDecode hold it to both.

// kind is how a field of a hot message reads its JSON value.
type kind uint8

const (
	kindType      kind = iota // the "type" member: no field, but first in Encode's layout
	kindString                // a string; null leaves it as it is
	kindStringPtr             // a *string; null sets it nil
	kindInt                   // an int; null leaves it as it is
	kindBool                  // a bool; null leaves it as it is
	kindRaw                   // a json.RawMessage: the value's text, null included
	kindPriority              // a *Priority: null sets it nil
)

// field is one member of a hot message.
type field struct {
	name string
	kind kind
	key  string // the member's key as Encode writes it: "name":
}

// layout is a hot message's members as Encode writes them: in this order, compact.
type layout struct {
	typ      string // the quoted "type" value Encode writes first; "" for none
	fields   []field
	optional int // how many of the last fields Encode leaves out when they are zero
	// others are the keys of the message's fields the scanner does not read (SUBMIT_JOB's
	// extensions): a member of one leaves the whole message to encoding/json.
	others []string
}

func newLayout(typ string, optional int, fields ...field) *layout {
	for f := range fields {
		fields[f].key = `"` + fields[f].name + `":`
	}
	return &layout{typ: typ, fields: fields, optional: optional}
}

// value is where the last member of a field left its value. A null that leaves the
// field as it is leaves the value as it was.
type value struct {
	set        bool
	null       bool  // set to null (a pointer field, a payload)
	text       bool  // a string, to decode
	escaped    bool  // a string with escapes
	ascii      bool  // a string of ASCII only
	start, end int   // the value's text; a string's without its quotes
	n          int64 // an int's value, a bool's as 0 or 1
	lo, hi     int   // a string's decoded text in the message's strings (see scanObject)
}

// The hot messages' layouts; each scan method sets the fields by their index here.
var (
	assignLayout = newLayout(`"TASK_ASSIGN"`, 2, field{name: "type"}, // trace context: omitempty
		field{name: "jobId", kind: kindString}, field{name: "attemptId", kind: kindString},
		field{name: "attemptNumber", kind: kindInt}, field{name: "taskType", kind: kindString},
		field{name: "payload", kind: kindRaw},
		field{name: "traceparent", kind: kindString}, field{name: "tracestate", kind: kindString})
	resultLayout = newLayout(`"TASK_RESULT"`, 2, field{name: "type"}, // permanent, snoozeMillis: omitzero
		field{name: "workerId", kind: kindString}, field{name: "jobId", kind: kindString},
		field{name: "attemptId", kind: kindString}, field{name: "success", kind: kindBool},
		field{name: "result", kind: kindStringPtr}, field{name: "error", kind: kindStringPtr},
		field{name: "permanent", kind: kindBool}, field{name: "snoozeMillis", kind: kindInt})
	resultAckLayout = newLayout("", 0, field{name: "jobId", kind: kindString}, field{name: "accepted", kind: kindBool})
	submitLayout    = newLayout(`"SUBMIT_JOB"`, 2, field{name: "type"}, // queue, concurrencyKey: omitempty
		field{name: "taskType", kind: kindString}, field{name: "payload", kind: kindRaw},
		field{name: "maxAttempts", kind: kindInt}, field{name: "idempotencyKey", kind: kindStringPtr},
		field{name: "priority", kind: kindPriority},
		field{name: "queue", kind: kindString}, field{name: "concurrencyKey", kind: kindString})
	submittedLayout = newLayout(`"JOB_SUBMITTED"`, 0, field{name: "type"}, field{name: "jobId", kind: kindString})
)

// SUBMIT_JOB's extension fields (queue, runAtMillis, ...) are encoding/json's to read.
func init() { submitLayout.others = submitLayout.unread(SubmitJob{}) }

// scan reads data into m; ok is false, m untouched, for what it leaves to
// encoding/json. exact says that Encode(m) writes data.
func (m *TaskAssign) scan(data []byte) (exact, ok bool) {
	if m.Payload != nil { // json.Unmarshal would reuse its array
		return false, false
	}
	var v [8]value
	all, exact, ok := scanObject(data, assignLayout, v[:])
	if !ok {
		return false, false
	}
	v[1].str(&m.JobID, all)
	v[2].str(&m.AttemptID, all)
	v[3].integer(&m.AttemptNumber)
	v[4].str(&m.TaskType, all)
	v[5].raw(&m.Payload, data)
	v[6].str(&m.TraceParent, all)
	v[7].str(&m.TraceState, all)
	// Encode writes the trace context when not empty, and only then.
	return exact && (m.TraceParent != "") == v[6].set && (m.TraceState != "") == v[7].set, true
}

func (m *TaskResult) scan(data []byte) (exact, ok bool) {
	if m.Result != nil || m.Error != nil { // json.Unmarshal would write through them
		return false, false
	}
	var v [9]value
	all, exact, ok := scanObject(data, resultLayout, v[:])
	if !ok {
		return false, false
	}
	v[1].str(&m.WorkerID, all)
	v[2].str(&m.JobID, all)
	v[3].str(&m.AttemptID, all)
	v[4].boolean(&m.Success)
	v[5].strPtr(&m.Result, all)
	v[6].strPtr(&m.Error, all)
	v[7].boolean(&m.Permanent)
	if v[8].set {
		m.SnoozeMillis = v[8].n
	}
	// Encode writes permanent when true, and only then; snoozeMillis when not 0.
	return exact && m.Permanent == v[7].set && (m.SnoozeMillis != 0) == v[8].set, true
}

// scan reads a ResultAck; exact says that json.Marshal writes data.
func (m *ResultAck) scan(data []byte) (exact, ok bool) {
	var v [2]value
	all, exact, ok := scanObject(data, resultAckLayout, v[:])
	if !ok {
		return false, false
	}
	v[0].str(&m.JobID, all)
	v[1].boolean(&m.Accepted)
	return exact, true
}

func (m *SubmitJob) scan(data []byte) (exact, ok bool) {
	if m.Payload != nil || m.IdempotencyKey != nil || m.Priority != nil {
		return false, false
	}
	var v [8]value
	all, exact, ok := scanObject(data, submitLayout, v[:])
	if !ok {
		return false, false
	}
	v[1].str(&m.TaskType, all)
	v[2].raw(&m.Payload, data)
	v[3].integer(&m.MaxAttempts)
	v[4].strPtr(&m.IdempotencyKey, all)
	v[5].priority(&m.Priority, data)
	v[6].str(&m.Queue, all)
	v[7].str(&m.ConcurrencyKey, all)
	// Encode leaves an empty queue or key out (omitempty), and a null one is not its.
	for _, f := range v[6:] {
		exact = exact && (!f.set || f.text && f.hi > f.lo)
	}
	return exact, true
}

func (m *JobSubmitted) scan(data []byte) (exact, ok bool) {
	var v [2]value
	all, exact, ok := scanObject(data, submittedLayout, v[:])
	if !ok {
		return false, false
	}
	v[1].str(&m.JobID, all)
	return exact, true
}

// scanHot reads a hot message as jobbus writes it, its type first, in one pass:
// DecodeExact's common case. ok is false for anything else (the scanner leaves a
// second "type" member too, which would decide the type), which DecodeExact reads the
// long way, as Decode always has: PeekType, then the scanner or encoding/json.
func scanHot(data []byte) (m Message, exact, ok bool) {
	const prefix = `{"type":`
	if !hasPrefix(data, prefix) {
		return nil, false, false
	}
	switch t := data[len(prefix):]; {
	case hasPrefix(t, assignLayout.typ):
		a := new(TaskAssign)
		exact, ok = a.scan(data)
		m = a
	case hasPrefix(t, resultLayout.typ):
		r := new(TaskResult)
		exact, ok = r.scan(data)
		m = r
	case hasPrefix(t, submitLayout.typ):
		s := new(SubmitJob)
		exact, ok = s.scan(data)
		m = s
	case hasPrefix(t, submittedLayout.typ):
		s := new(JobSubmitted)
		exact, ok = s.scan(data)
		m = s
	case hasPrefix(t, `"SUBMIT_JOBS"`):
		// Its submissions' "type" keys would send it to PeekType's encoding/json pass;
		// the scanner takes only its own layout, where no second "type" fits.
		s := new(SubmitJobs)
		exact, ok = s.scan(data)
		m = s
	case hasPrefix(t, `"JOBS_SUBMITTED"`): // its answers' "type" keys, likewise
		s := new(JobsSubmitted)
		exact, ok = s.scan(data)
		m = s
	}
	return m, exact, ok
}

// DecodeJSON decodes a whole payload into m exactly as json.Unmarshal(data, m) does
// (bus.Decoder): the same fields set, the same errors. So do the other hot messages'.
func (m *TaskAssign) DecodeJSON(data []byte) error   { return decodeJSON(m, data) }
func (m *TaskResult) DecodeJSON(data []byte) error   { return decodeJSON(m, data) }
func (m *ResultAck) DecodeJSON(data []byte) error    { return decodeJSON(m, data) }
func (m *SubmitJob) DecodeJSON(data []byte) error    { return decodeJSON(m, data) }
func (m *JobSubmitted) DecodeJSON(data []byte) error { return decodeJSON(m, data) }

// decodeJSON scans data into m, or leaves it to json.Unmarshal.
func decodeJSON(m interface{ scan([]byte) (exact, ok bool) }, data []byte) error {
	if _, ok := m.scan(data); !ok {
		return json.Unmarshal(data, m)
	}
	return nil
}

// scanList reads the elements of the array whose '[' is just before data[i], each as
// P's scanner reads it, and returns them with the index of the array's ']'; ok is
// false for anything it leaves to encoding/json. The batches (TaskAssigns,
// TaskResults, ResultAcks) are arrays of hot messages.
func scanList[T any, P interface {
	*T
	scan([]byte) (exact, ok bool)
}](data []byte, i int) (list []T, end int, ok bool) {
	n := 0
	for j := i; j < len(data) && data[j] != ']'; n++ { // count the elements first
		e, _ := skipValue(data, j, 0)
		if e < 0 || e >= len(data) || data[e] != ',' && data[e] != ']' {
			return nil, 0, false
		}
		j = e
		if data[j] == ',' {
			j++
		}
	}
	list = make([]T, n)
	for k := range list {
		e, _ := skipValue(data, i, 0)
		if _, good := P(&list[k]).scan(data[i:e]); !good {
			return nil, 0, false
		}
		i = e
		if k < n-1 {
			i++ // the ','
		}
	}
	return list, i, true
}

// scanObject reads data, which must be one JSON object and nothing else but
// whitespace, into vals (one per field of l): each field's last value, checked to be
// one encoding/json stores in the field. It returns every string value decoded, in one
// allocation: a value's text is all[lo:hi]. ok is false for anything it leaves to
// encoding/json: a key with escapes or one that matches a field only
// case-insensitively, a value of the wrong type, invalid JSON. exact says that the
// bytes are the layout's: its members in order, compact, each value as Encode writes it.
func scanObject(data []byte, l *layout, vals []value) (all string, exact, ok bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return "", false, false
	}
	exact = i == 0
	n := 0         // members read
	typed := false // a "type" member read
	i, exact = space(data, i+1, exact)
	if i < len(data) && data[i] == '}' {
		i++
	} else {
		for {
			f := -1
			if n < len(l.fields) && hasPrefix(data[i:], l.fields[n].key) {
				f, i = n, i+len(l.fields[n].key) // as Encode writes it: the common case
			} else if f, i, exact = readKey(data, i, l, n, exact); i < 0 {
				return "", false, false
			}
			var vexact bool
			switch {
			case f < 0:
				i, _ = skipValue(data, i, 0)
			case l.fields[f].kind == kindType && typed:
				return "", false, false // the last decides the type: encoding/json's to judge
			default:
				typed = typed || l.fields[f].kind == kindType
				i, vexact = readValue(data, i, l, f, &vals[f])
			}
			if i < 0 {
				return "", false, false
			}
			exact = exact && vexact
			n++
			if i, exact = space(data, i, exact); i >= len(data) {
				return "", false, false
			}
			if data[i] == '}' {
				i++
				break
			}
			if data[i] != ',' {
				return "", false, false
			}
			i, exact = space(data, i+1, exact)
		}
	}
	if skipSpace(data, i) != len(data) {
		return "", false, false
	}
	exact = exact && i == len(data) && n >= len(l.fields)-l.optional
	all, ok = decodeStrings(data, vals)
	return all, exact && ok, ok
}

// readKey reads the key of the n-th member, at data[i], and the colon after it. It
// returns the index of the key's field (-1 for a key encoding/json ignores) and the
// index of the value; -1 for a key it leaves to encoding/json. The key is not the
// layout's n-th: exact becomes false unless it is, spaced otherwise.
func readKey(data []byte, i int, l *layout, n int, exact bool) (f, next int, _ bool) {
	if i >= len(data) || data[i] != '"' {
		return -1, -1, false
	}
	kend := i + 1
	for kend < len(data) && data[kend] != '"' && data[kend] != '\\' && data[kend] >= 0x20 {
		kend++
	}
	if kend >= len(data) || data[kend] != '"' {
		return -1, -1, false // an escape, a control character, or the end
	}
	key := data[i+1 : kend]
	i, exact = space(data, kend+1, exact)
	if i >= len(data) || data[i] != ':' {
		return -1, -1, false
	}
	i, exact = space(data, i+1, exact)
	if f = l.find(key); f < 0 && (!ignorable(key, l.fields) || l.other(key)) {
		return -1, -1, false
	}
	return f, i, exact && f == n
}

// space skips whitespace from i, which Encode never writes.
func space(data []byte, i int, exact bool) (int, bool) {
	if i < len(data) && data[i] > ' ' {
		return i, exact // no whitespace: the common case
	}
	j := skipSpace(data, i)
	return j, exact && j == i
}

func hasPrefix(b []byte, prefix string) bool {
	return len(b) >= len(prefix) && string(b[:len(prefix)]) == prefix
}

// other reports whether key names one of the fields the scanner does not read (as
// encoding/json matches keys: case-insensitively).
func (l *layout) other(key []byte) bool {
	for _, name := range l.others {
		if len(name) == len(key) && strings.EqualFold(name, string(key)) {
			return true
		}
	}
	return false
}

// unread returns the JSON keys of struct v's fields that the layout does not read.
func (l *layout) unread(v any) []string {
	var out []string
	t := reflect.TypeOf(v)
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" && l.find([]byte(name)) < 0 {
			out = append(out, name)
		}
	}
	return out
}

// find returns the index of the field named key, or -1.
func (l *layout) find(key []byte) int {
	for f := range l.fields {
		if l.fields[f].name == string(key) {
			return f
		}
	}
	return -1
}

// ignorable reports whether encoding/json ignores key, given the fields: it matches a
// field case-insensitively too (with Unicode folding, hence plain ASCII only here).
func ignorable(key []byte, fields []field) bool {
	for _, c := range key {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	for _, f := range fields {
		if f.kind != kindType && len(f.name) == len(key) && strings.EqualFold(f.name, string(key)) {
			return false
		}
	}
	return true
}

// readValue reads the value at data[i] into v, the f-th field of l, and returns the
// index past it (-1 for what it leaves to encoding/json) and whether Encode writes it
// so. A null sets a pointer field (and a payload) and leaves any other as it is, which
// Encode never writes.
func readValue(data []byte, i int, l *layout, f int, v *value) (int, bool) {
	if i >= len(data) {
		return -1, false
	}
	null := data[i] == 'n' && hasPrefix(data[i:], "null")
	switch l.fields[f].kind {
	case kindType: // no field: any value, and Encode's is the type
		if hasPrefix(data[i:], l.typ) {
			return i + len(l.typ), true
		}
		end, _ := skipValue(data, i, 0)
		return end, false
	case kindRaw:
		end, exact := skipValue(data, i, 0)
		*v = value{set: true, null: null, start: i, end: end}
		return end, exact
	case kindString, kindStringPtr:
		switch {
		case data[i] == '"':
			end, escaped, ascii, exact := scanString(data, i)
			if end < 0 {
				return -1, false
			}
			*v = value{set: true, text: true, escaped: escaped, ascii: ascii, start: i + 1, end: end - 1}
			return end, exact
		case null && l.fields[f].kind == kindStringPtr:
			*v = value{set: true, null: true}
			return i + 4, true
		case null:
			return i + 4, false
		}
	case kindInt:
		if null {
			return i + 4, false
		}
		end, n, ok := scanInt(data, i)
		if !ok {
			return -1, false
		}
		*v = value{set: true, n: n}
		return end, data[i] != '-' // -0 is written 0; a negative one is left inexact
	case kindBool:
		switch {
		case data[i] == 't' && hasPrefix(data[i:], "true"):
			*v = value{set: true, n: 1}
			return i + 4, true
		case data[i] == 'f' && hasPrefix(data[i:], "false"):
			*v = value{set: true}
			return i + 5, true
		case null:
			return i + 4, false
		}
	case kindPriority:
		if null {
			*v = value{set: true, null: true}
			return i + 4, true
		}
		for _, p := range [...]string{`"HIGH"`, `"NORMAL"`, `"LOW"`} {
			if hasPrefix(data[i:], p) {
				*v = value{set: true, start: i + 1, end: i + len(p) - 1}
				return i + len(p), true
			}
		}
	}
	return -1, false
}

// scanInt reads an integer literal of up to 18 digits (which fit any int64); other
// numbers, 1.0 and 1e3 among them, are encoding/json's to accept or refuse.
func scanInt(data []byte, i int) (end int, n int64, ok bool) {
	end = skipNumber(data, i)
	if end < 0 {
		return -1, 0, false
	}
	digits := data[i:end]
	neg := digits[0] == '-'
	if neg {
		digits = digits[1:]
	}
	if len(digits) > 18 {
		return -1, 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return -1, 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	if strconv.IntSize == 32 && n != int64(int32(n)) {
		return -1, 0, false
	}
	return end, n, true
}

// scanString returns the index past the JSON string that starts at data[i] (a quote),
// or -1 for one it leaves to encoding/json: invalid, or with a \u escape beyond ASCII.
// exact says that appendString writes the string it holds so: ASCII, with the escapes
// it uses and no others.
func scanString(data []byte, i int) (end int, escaped, ascii, exact bool) {
	ascii, exact = true, true
	for j := i + 1; ; {
		j = skipPlain(data, j)
		if j >= len(data) {
			break
		}
		c := data[j]
		if plainASCII[c] {
			j++
			continue
		}
		switch {
		case c == '"':
			return j + 1, escaped, ascii, exact
		case c < 0x20:
			return -1, false, false, false
		case c == '\\':
			escaped = true
			if j+1 >= len(data) {
				return -1, false, false, false
			}
			switch data[j+1] {
			case '"', '\\', 'b', 'f', 'n', 'r', 't':
				j += 2
			case '/':
				exact = false
				j += 2
			case 'u':
				r, ok := hex4(data, j+2)
				if !ok || r >= utf8.RuneSelf {
					return -1, false, false, false
				}
				exact = exact && uEscaped(byte(r)) && lowerHex(data[j+2:j+6])
				j += 6
			default:
				return -1, false, false, false
			}
		case c == '<' || c == '>' || c == '&': // appendString escapes them
			exact = false
			j++
		default: // beyond ASCII: appendString leaves the string to json.Marshal
			ascii, exact = false, false
			j++
		}
	}
	return -1, false, false, false
}

// uEscaped reports whether appendString writes c as \u00XX.
func uEscaped(c byte) bool {
	switch c {
	case '\b', '\f', '\n', '\r', '\t':
		return false
	}
	return c < 0x20 || c == '<' || c == '>' || c == '&'
}

// lowerHex reports whether hex digits are written as appendString writes them: in
// lower case.
func lowerHex(h []byte) bool {
	for _, c := range h {
		if c >= 'A' && c <= 'F' {
			return false
		}
	}
	return true
}

// hex4 reads the four hex digits at data[i:].
func hex4(data []byte, i int) (rune, bool) {
	if len(data)-i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// plainASCII marks the bytes that stand for themselves in a JSON string and that
// appendString writes as they are: printable ASCII but for ", \, <, > and &.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// skipPlain returns the index of the first byte from i that is not plainASCII, or
// len(data): strings are most of a hot message.
func skipPlain(data []byte, i int) int {
	for ; i+8 <= len(data); i += 8 {
		b := data[i : i+8 : i+8]
		if !(plainASCII[b[0]] && plainASCII[b[1]] && plainASCII[b[2]] && plainASCII[b[3]] &&
			plainASCII[b[4]] && plainASCII[b[5]] && plainASCII[b[6]] && plainASCII[b[7]]) {
			break
		}
	}
	for _, c := range data[i:] {
		if !plainASCII[c] {
			break
		}
		i++
	}
	return i
}

// decodeStrings decodes the string values of vals into one string, setting each one's
// lo and hi. ok is false for a string encoding/json would read otherwise (invalid
// UTF-8, which it replaces).
func decodeStrings(data []byte, vals []value) (all string, ok bool) {
	size, n, last := 0, 0, -1
	for f := range vals {
		if v := &vals[f]; v.text {
			size += v.end - v.start
			n, last = n+1, f
		}
	}
	switch v := &vals[max(last, 0)]; {
	case n == 0:
		return "", true
	case n == 1 && !v.escaped && (v.ascii || utf8.Valid(data[v.start:v.end])):
		v.lo, v.hi = 0, v.end-v.start // one string as it is, as a ResultAck's
		return string(data[v.start:v.end]), true
	}
	var b strings.Builder
	b.Grow(size)
	for f := range vals {
		v := &vals[f]
		if !v.text {
			continue
		}
		s := data[v.start:v.end]
		if !v.ascii && !utf8.Valid(s) {
			return "", false
		}
		v.lo = b.Len()
		if v.escaped {
			unescape(&b, s)
		} else {
			b.Write(s)
		}
		v.hi = b.Len()
	}
	return b.String(), true
}

// unescape writes the content of a JSON string that scanString accepted.
func unescape(b *strings.Builder, s []byte) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
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
		case 'u': // ASCII only (scanString)
			r, _ := hex4(s, i+1)
			b.WriteByte(byte(r))
			i += 4
		default: // " \ /
			b.WriteByte(s[i])
		}
	}
}

// The setters store a value read by scanObject in its field.

func (v *value) str(dst *string, all string) {
	if v.set {
		*dst = all[v.lo:v.hi]
	}
}

func (v *value) strPtr(dst **string, all string) {
	switch {
	case !v.set:
	case v.null:
		*dst = nil
	default:
		s := all[v.lo:v.hi]
		*dst = &s
	}
}

func (v *value) integer(dst *int) {
	if v.set {
		*dst = int(v.n)
	}
}

func (v *value) boolean(dst *bool) {
	if v.set {
		*dst = v.n != 0
	}
}

func (v *value) raw(dst *json.RawMessage, data []byte) {
	if v.set {
		*dst = append(json.RawMessage(nil), data[v.start:v.end]...)
	}
}

func (v *value) priority(dst **Priority, data []byte) {
	switch {
	case !v.set:
	case v.null:
		*dst = nil
	default:
		p := priorities[string(data[v.start:v.end])]
		*dst = &p
	}
}

var priorities = map[string]Priority{"HIGH": PriorityHigh, "NORMAL": PriorityNormal, "LOW": PriorityLow}

// maxFastDepth bounds the nesting skipValue follows; deeper values (encoding/json takes
// up to 10,000 levels) go the slow way.
const maxFastDepth = 64

// skipValue returns the index just past the JSON value that starts at b[i], or -1 if
// there is none there that it accepts: it accepts only valid JSON (what encoding/json's
// scanner accepts), nested at most maxFastDepth deep. exact says that json.Marshal
// copies the value unchanged from a json.RawMessage: no whitespace between tokens,
// none of the characters it escapes (<, >, &, U+2028, U+2029).
func skipValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return -1, false
	}
	switch c := b[i]; {
	case c == '"':
		return skipString(b, i)
	case c == '{' || c == '[':
		if depth >= maxFastDepth {
			return -1, false
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		exact := true
		if i, exact = space(b, i+1, exact); i < len(b) && b[i] == closer {
			return i + 1, exact
		}
		for {
			var ex bool
			if c == '{' {
				if i >= len(b) || b[i] != '"' {
					return -1, false
				}
				if i, ex = skipString(b, i); i < 0 {
					return -1, false
				}
				if i, exact = space(b, i, exact && ex); i >= len(b) || b[i] != ':' {
					return -1, false
				}
				i, exact = space(b, i+1, exact)
			}
			if i, ex = skipValue(b, i, depth+1); i < 0 {
				return -1, false
			}
			if i, exact = space(b, i, exact && ex); i >= len(b) {
				return -1, false
			}
			switch b[i] {
			case closer:
				return i + 1, exact
			case ',':
				i, exact = space(b, i+1, exact)
			default:
				return -1, false
			}
		}
	case c == '-' || c >= '0' && c <= '9':
		end := skipNumber(b, i)
		return end, end > 0
	case c == 't':
		return skipLiteral(b, i, "true")
	case c == 'f':
		return skipLiteral(b, i, "false")
	case c == 'n':
		return skipLiteral(b, i, "null")
	}
	return -1, false
}

func skipLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1, false
	}
	return i + len(lit), true
}

// skipString returns the index past the string starting at b[i] (a quote), or -1, and
// whether json.Marshal copies it unchanged from a json.RawMessage.
func skipString(b []byte, i int) (int, bool) {
	exact := true
	for i++; ; i++ {
		if i = skipPlain(b, i); i >= len(b) {
			break
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, exact
		case c < 0x20:
			return -1, false
		case c == '\\':
			if i++; i >= len(b) {
				return -1, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if _, ok := hex4(b, i+1); !ok {
					return -1, false
				}
				i += 4
			default:
				return -1, false
			}
		case c == '<' || c == '>' || c == '&':
			exact = false
		case c == 0xE2 && len(b)-i > 2 && b[i+1] == 0x80 && (b[i+2] == 0xA8 || b[i+2] == 0xA9):
			exact = false
		}
	}
	return -1, false
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
