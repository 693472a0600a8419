package tasktype

import (
	"bytes"
	"encoding/json"
	"maps"
	"testing"
)

// FuzzParseObject holds parseObject to what json.Unmarshal into a map of raw values
// reads: the same objects accepted, the same members, a later duplicate winning. Seeds
// in testdata/fuzz/FuzzParseObject.
func FuzzParseObject(f *testing.F) {
	for _, s := range []string{`{}`, ` {"text":"a\"b"} `, `{"a":1,"a":2}`, `{"n":{"x":[1,"]}"]},"m":-1.5e3}`,
		`{"\u0074ext":"x"}`, "{\"k\xff\":1}", `null`, `[1]`, `{"a":1}x`, `{"a":tru}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, perr := parseObject(payload)
		var want fields
		trimmed := bytes.TrimLeft(payload, " \t\r\n")
		ok := len(trimmed) > 0 && trimmed[0] == '{' && json.Unmarshal(trimmed, &want) == nil
		if (perr == nil) != ok {
			t.Fatalf("parseObject(%q) error %v, json.Unmarshal accepts it: %v", payload, perr, ok)
		}
		if ok && !maps.EqualFunc(got, want, func(a, b json.RawMessage) bool { return bytes.Equal(a, b) }) {
			t.Fatalf("parseObject(%q) = %q, json.Unmarshal reads %q", payload, got, want)
		}
	})
}

func BenchmarkParseObject(b *testing.B) {
	payload := json.RawMessage(`{"text":"job 12345 of the benchmark, a hundred bytes of text or so to hash, as bench submits"}`)
	b.Run("scan", func(b *testing.B) {
		for b.Loop() {
			_, _ = parseObject(payload)
		}
	})
	b.Run("unmarshal", func(b *testing.B) {
		for b.Loop() {
			var f fields
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
		raw = bytes.TrimSpace(raw) // as stringField reads it
		if len(raw) == 0 || raw[0] != '"' || !json.Valid(raw) {
			return
		}
		got, ok := plainString(raw)
		var want string
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("json.Unmarshal(%q): %v", raw, err)
		}
		if ok && got != want {
			t.Fatalf("plainString(%q) = %q, json.Unmarshal reads %q", raw, got, want)
		}
	})
}
