package tasktype

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// object is a payload that parseObject accepted: a valid JSON object, without the
// space before it. Its members are read in place, by name (member), without a map of
// them: every job's payload is read here on the coordinator and on the worker, and each
// built-in type reads one field.
type object []byte

func payloadErrorf(format string, args ...any) *PayloadError {
	return &PayloadError{Message: fmt.Sprintf(format, args...)}
}

// parseObject checks payload, which must be a JSON object. A missing payload, null,
// any other JSON value or malformed JSON is rejected alike. Its members are what
// json.Unmarshal into a map of raw values would read (FuzzParseObject holds them to
// that), without its reflection and copies.
func parseObject(payload json.RawMessage) (object, *PayloadError) {
	trimmed := payload[skipSpace(payload, 0):] // the space json.Unmarshal skips
	// Unmarshal accepts null into a map, so the opening brace is checked first.
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(trimmed) {
		return nil, &PayloadError{Message: "Payload must be a JSON object"}
	}
	return object(trimmed), nil
}

// member is the raw value of o's member named name, nil if o has none; of duplicates
// the last wins, as with json.Unmarshal. The value is a slice of o.
func (o object) member(name string) json.RawMessage {
	var v json.RawMessage
	for key, val := range o.members {
		if keyIs(key, name) {
			v = val
		}
	}
	return v
}

// members yields each member of o in order (an iter.Seq2, ranged over as o.members):
// its quoted name, as written, and its raw value, both slices of o.
func (o object) members(yield func(key []byte, val json.RawMessage) bool) {
	b := []byte(o)
	i := 1
	for {
		i = skipSpace(b, i)
		switch b[i] {
		case '}':
			return
		case ',':
			i = skipSpace(b, i+1)
		}
		end := stringEnd(b, i)
		key := b[i:end]
		i = skipSpace(b, skipSpace(b, end)+1) // past the colon
		vend := valueEnd(b, i)
		if !yield(key, json.RawMessage(b[i:vend:vend])) {
			return
		}
		i = vend
	}
}

// keyIs reports whether q, a quoted member name, decodes to name. One without escapes
// or bytes beyond ASCII is its own text and is compared in place; the others take
// unquoteKey's path.
func keyIs(q []byte, name string) bool {
	for _, c := range q {
		if c == '\\' || c >= utf8.RuneSelf {
			return unquoteKey(q) == name
		}
	}
	return string(q[1:len(q)-1]) == name
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// stringEnd is the index just past the string that starts at b[i].
func stringEnd(b []byte, i int) int {
	for i++; b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// valueEnd is the index just past the value that starts at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for i < len(b) && strings.IndexByte(",}] \t\r\n", b[i]) < 0 {
		i++
	}
	return i
}

// unquoteKey decodes a member name; one with escapes, or bytes beyond ASCII (which
// json.Unmarshal checks and may replace), takes json.Unmarshal's own path.
func unquoteKey(q []byte) string {
	for _, c := range q {
		if c == '\\' || c >= utf8.RuneSelf {
			var s string
			_ = json.Unmarshal(q, &s)
			return s
		}
	}
	return string(q[1 : len(q)-1])
}

// plainString returns the text of raw, a valid JSON string (parseObject checked the
// payload), when it is its own text: no escapes, valid UTF-8 (json.Unmarshal replaces
// invalid bytes). Every job's text is; json.Unmarshal reads the others.
func plainString(raw []byte) ([]byte, bool) {
	q := raw[1 : len(raw)-1]
	ascii := true
	for _, c := range q {
		if c == '\\' {
			return nil, false
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(q) {
		return nil, false
	}
	return q, true
}

// intField reads an integer field within [lo, hi]. Only JSON integer literals
// count: 1.0, 1e3 and values beyond int64 are rejected, as the reference does.
func (o object) intField(name string, lo, hi int64) (int64, *PayloadError) {
	raw := bytes.TrimSpace(o.member(name))
	if len(raw) == 0 || !(raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9')) ||
		bytes.ContainsAny(raw, ".eE") {
		return 0, payloadErrorf("Field '%s' must be an integer", name)
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, payloadErrorf("Field '%s' must be an integer", name)
	}
	if n < lo || n > hi {
		return 0, payloadErrorf("Field '%s' must be in [%d, %d], got %d", name, lo, hi, n)
	}
	return n, nil
}

// bytesField reads a string field of at most maxChars characters as its UTF-8 bytes. A
// text that is its own JSON (no escapes, valid UTF-8: every job's) is a slice of o,
// neither copied nor to be modified; json.Unmarshal decodes the others.
func (o object) bytesField(name string, maxChars int) ([]byte, *PayloadError) {
	raw := bytes.TrimSpace(o.member(name))
	if len(raw) == 0 || raw[0] != '"' {
		return nil, payloadErrorf("Field '%s' must be a string", name)
	}
	b, ok := plainString(raw)
	if !ok {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, payloadErrorf("Field '%s' must be a string", name)
		}
		b = []byte(s)
	}
	if utf16Len(b) > maxChars {
		return nil, payloadErrorf("Field '%s' exceeds %d characters", name, maxChars)
	}
	return b, nil
}

// utf16Len counts s in UTF-16 code units, because the reference implementation
// is Java, whose String.length() counts those rather than code points: a
// character outside the BMP (an emoji) counts as two.
func utf16Len(s []byte) int {
	n := 0
	for len(s) > 0 {
		r, size := utf8.DecodeRune(s) // as ranging over string(s) would, without its copy
		s = s[size:]
		// Decoding never yields surrogates, so RuneLen is 1 or 2.
		n += utf16.RuneLen(r)
	}
	return n
}
