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

// fields is a decoded payload object: field name to raw JSON value.
// Unknown fields are kept but never read, so they are ignored.
type fields map[string]json.RawMessage

func payloadErrorf(format string, args ...any) *PayloadError {
	return &PayloadError{Message: fmt.Sprintf(format, args...)}
}

// parseObject decodes payload, which must be a JSON object. A missing payload,
// null, any other JSON value or malformed JSON is rejected alike. It reads what
// json.Unmarshal into a fields map would (FuzzParseObject holds it to that), without
// its reflection and copies: every job's payload passes here on the coordinator and
// on the worker.
func parseObject(payload json.RawMessage) (fields, *PayloadError) {
	trimmed := bytes.TrimLeft(payload, " \t\r\n")
	// Unmarshal accepts null into a map, so the opening brace is checked first.
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(trimmed) {
		return nil, &PayloadError{Message: "Payload must be a JSON object"}
	}
	return scanObject(trimmed), nil
}

// scanObject reads the members of b, a valid JSON object: a later duplicate key
// wins, as with json.Unmarshal. The values are slices of b.
func scanObject(b []byte) fields {
	f := make(fields, 4)
	i := 1
	for {
		i = skipSpace(b, i)
		switch b[i] {
		case '}':
			return f
		case ',':
			i = skipSpace(b, i+1)
		}
		end := stringEnd(b, i)
		key := b[i:end]
		i = skipSpace(b, skipSpace(b, end)+1) // past the colon
		vend := valueEnd(b, i)
		f[unquoteKey(key)] = json.RawMessage(b[i:vend:vend])
		i = vend
	}
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

// plainString reads raw, a valid JSON string (parseObject checked the payload), when
// it is its own text: no escapes, valid UTF-8 (json.Unmarshal replaces invalid bytes).
// Every job's text passes here; json.Unmarshal reads the others.
func plainString(raw []byte) (string, bool) {
	q := raw[1 : len(raw)-1]
	ascii := true
	for _, c := range q {
		if c == '\\' {
			return "", false
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(q) {
		return "", false
	}
	return string(q), true
}

// intField reads an integer field within [lo, hi]. Only JSON integer literals
// count: 1.0, 1e3 and values beyond int64 are rejected, as the reference does.
func (f fields) intField(name string, lo, hi int64) (int64, *PayloadError) {
	raw := bytes.TrimSpace(f[name])
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

// stringField reads a string field of at most maxChars characters.
func (f fields) stringField(name string, maxChars int) (string, *PayloadError) {
	raw := bytes.TrimSpace(f[name])
	if len(raw) == 0 || raw[0] != '"' {
		return "", payloadErrorf("Field '%s' must be a string", name)
	}
	s, ok := plainString(raw)
	if !ok && json.Unmarshal(raw, &s) != nil {
		return "", payloadErrorf("Field '%s' must be a string", name)
	}
	if utf16Len(s) > maxChars {
		return "", payloadErrorf("Field '%s' exceeds %d characters", name, maxChars)
	}
	return s, nil
}

// utf16Len counts s in UTF-16 code units, because the reference implementation
// is Java, whose String.length() counts those rather than code points: a
// character outside the BMP (an emoji) counts as two.
func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		// Ranging over a string never yields surrogates, so RuneLen is 1 or 2.
		n += utf16.RuneLen(r)
	}
	return n
}
