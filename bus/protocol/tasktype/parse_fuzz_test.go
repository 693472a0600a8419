package tasktype

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
)

// fieldNames are the members the built-in types read.
var fieldNames = []string{"text", "durationMillis", "limit", "failUntilAttempt"}

// FuzzParseObject holds parseObject to what json.Unmarshal into a map of raw values
// reads: the same objects accepted, the same members, a later duplicate winning, each
// found by member; and a field's reading (bytesField) to the string json.Unmarshal
// decodes. Seeds in testdata/fuzz/FuzzParseObject.
func FuzzParseObject(f *testing.F) {
	for _, s := range []string{`{}`, ` {"text":"a\"b"} `, `{"a":1,"a":2}`, `{"n":{"x":[1,"]}"]},"m":-1.5e3}`,
		`{"\u0074ext":"x"}`, "{\"k\xff\":1}", `null`, `[1]`, `{"a":1}x`, `{"a":tru}`,
		`{"text":"a","text":5}`, `{"text":5,"text":"\u00e9"}`, "{\"text\":\"\xff\"}", `{"limit":7,"li\u006dit":8}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		o, perr := parseObject(payload)
		var want map[string]json.RawMessage
		trimmed := bytes.TrimLeft(payload, " \t\r\n")
		ok := len(trimmed) > 0 && trimmed[0] == '{' && json.Unmarshal(trimmed, &want) == nil
		if (perr == nil) != ok {
			t.Fatalf("parseObject(%q) error %v, json.Unmarshal accepts it: %v", payload, perr, ok)
		}
		if !ok {
			return
		}
		got := map[string]json.RawMessage{}
		for key, val := range o.members {
			got[unquoteKey(key)] = val
		}
		if !maps.EqualFunc(got, want, func(a, b json.RawMessage) bool { return bytes.Equal(a, b) }) {
			t.Fatalf("members of %q = %q, json.Unmarshal reads %q", payload, got, want)
		}
		for _, name := range append(slices.Collect(maps.Keys(want)), fieldNames...) {
			if m := o.member(name); !bytes.Equal(m, want[name]) || (m == nil) != (want[name] == nil) {
				t.Fatalf("member(%q) of %q = %q, json.Unmarshal reads %q", name, payload, m, want[name])
			}
		}
		for _, most := range []int{MaxTextChars, 3} {
			b, berr := o.bytesField("text", most)
			var ref string
			refOK := json.Unmarshal(want["text"], &ref) == nil && bytes.HasPrefix(bytes.TrimSpace(want["text"]), []byte(`"`))
			if refOK != (berr == nil || strings.Contains(berr.Message, "exceeds")) {
				t.Fatalf("bytesField of %q: %v, json.Unmarshal reads a string: %v", payload, berr, refOK)
			}
			if berr == nil && string(b) != ref {
				t.Fatalf("bytesField of %q = %q, json.Unmarshal reads %q", payload, b, ref)
			}
		}
	})
}

func BenchmarkParseObject(b *testing.B) {
	payload := json.RawMessage(`{"text":"job 12345 of the benchmark, a hundred bytes of text or so to hash, as bench submits"}`)
	b.Run("args", func(b *testing.B) {
		for b.Loop() {
			_, _ = SHA256.Args(payload)
		}
	})
	b.Run("validate", func(b *testing.B) {
		for b.Loop() {
			_ = SHA256.Validate(payload)
		}
	})
	b.Run("unmarshal", func(b *testing.B) {
		for b.Loop() {
			var f map[string]json.RawMessage
			_ = json.Unmarshal(payload, &f)
		}
	})
}

// FuzzPlainString holds plainString to json.Unmarshal for every JSON string it reads.
func FuzzPlainString(f *testing.F) {
	for _, s := range []string{`""`, `"text"`, `"a\"b"`, `"\u00e9"`, "\"\xc3\xa9\"", "\"\xff\"", "\"\xed\xa0\x80\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		raw = bytes.TrimSpace(raw) // as bytesField reads it
		if len(raw) == 0 || raw[0] != '"' || !json.Valid(raw) {
			return
		}
		got, ok := plainString(raw)
		var want string
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("json.Unmarshal(%q): %v", raw, err)
		}
		if ok && string(got) != want {
			t.Fatalf("plainString(%q) = %q, json.Unmarshal reads %q", raw, got, want)
		}
	})
}
