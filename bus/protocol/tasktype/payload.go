package tasktype

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf16"
)

// fields is a decoded payload object: field name to raw JSON value.
// Unknown fields are kept but never read, so they are ignored.
type fields map[string]json.RawMessage

func payloadErrorf(format string, args ...any) *PayloadError {
	return &PayloadError{Message: fmt.Sprintf(format, args...)}
}

// parseObject decodes payload, which must be a JSON object. A missing payload,
// null, any other JSON value or malformed JSON is rejected alike.
func parseObject(payload json.RawMessage) (fields, *PayloadError) {
	trimmed := bytes.TrimLeft(payload, " \t\r\n")
	var f fields
	// Unmarshal accepts null into a map, so the opening brace is checked first.
	if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &f) != nil {
		return nil, &PayloadError{Message: "Payload must be a JSON object"}
	}
	return f, nil
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
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
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
