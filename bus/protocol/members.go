package protocol

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
)

// JSON member names are case-sensitive: to the spec's peers, whose parsers match them as
// written, "JobId" is not "jobId" but an unknown member, which PROTOCOL.md says is
// ignored. encoding/json would also fill a field from a member whose name matches the
// field's only when case is folded: the "JobId" of {"jobId":"a","JobId":"b"} would
// replace a, and {"TYPE":"HEARTBEAT"} would be a heartbeat. So Decode drops such
// members before encoding/json reads a message (withoutFoldedMembers), and PeekType reads
// "type" as written.

// typeMember is the name PeekType reads.
var typeMember = []string{"type"}

// fieldNames are the JSON names of each message type's fields, as written in their tags.
var fieldNames = func() map[Type][]string {
	names := make(map[Type][]string, len(newMessage))
	for t, fresh := range newMessage {
		names[t] = jsonNames(reflect.TypeOf(fresh()).Elem())
	}
	return names
}()

// jsonNames returns the JSON names of struct t's fields, those of embedded structs
// without a name of their own included, as encoding/json sees them.
func jsonNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
		case name == "" && f.Anonymous && f.Type.Kind() == reflect.Struct:
			names = append(names, jsonNames(f.Type)...)
		case name == "" && f.IsExported():
			names = append(names, f.Name)
		case name != "":
			names = append(names, name)
		}
	}
	return names
}

// withoutFoldedMembers returns data, a JSON message, without the members of its
// object whose names match one of names only when case is folded. It returns data
// itself when it has none (nearly always: the check is one pass over data), and when
// it is not a valid JSON object, which encoding/json then refuses as it would.
func withoutFoldedMembers(data []byte, names []string) []byte {
	if !mayFold(data, names) {
		return data
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return data
	}
	var kept [][]byte
	dropped := false
	for dec.More() {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return data
		}
		key, _ := tok.(string)
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return data
		}
		if folded(key, names) {
			dropped = true
			continue
		}
		// The member as written: its key (escapes and all), the colon and its value.
		kept = append(kept, bytes.TrimLeft(data[start:dec.InputOffset()], " \t\r\n,"))
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') || !dropped ||
		len(bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n")) != 0 {
		return data // nothing to drop, or bytes after the object: encoding/json judges data
	}
	out := make([]byte, 0, len(data))
	out = append(out, '{')
	out = append(out, bytes.Join(kept, []byte{','})...)
	return append(out, '}')
}

// folded reports whether key names one of names only when case is folded.
func folded(key string, names []string) bool {
	for _, n := range names {
		if key != n && strings.EqualFold(key, n) {
			return true
		}
	}
	return false
}

// The two runes beyond ASCII that fold to ASCII letters: the Kelvin sign (k) and the
// long s (s).
var (
	kelvin = []byte("\u212a")
	longS  = []byte("\u017f")
)

// mayFold reports whether data may hold a member whose name matches one of names, all
// ASCII, only when case is folded: a quoted string that does (in a name or a value), an
// escape, or a rune beyond ASCII that folds to an ASCII letter.
func mayFold(data []byte, names []string) bool {
	if bytes.IndexByte(data, '\\') >= 0 || bytes.Contains(data, kelvin) || bytes.Contains(data, longS) {
		return true
	}
	for i := 0; ; i++ {
		q := bytes.IndexByte(data[i:], '"')
		if q < 0 {
			return false
		}
		i += q
		for _, n := range names {
			if end := i + 1 + len(n); end < len(data) && data[end] == '"' &&
				string(data[i+1:end]) != n && bytes.EqualFold(data[i+1:end], []byte(n)) {
				return true
			}
		}
	}
}
