package mu

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecode checks the Mu port's decoder on any bytes: it never panics; whatever it
// accepts is a JSON object with a valid messageType, and re-encodes to a message that
// decodes to the same fields and encodes to the same bytes again; whatever it refuses
// is ErrMalformed.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		if !m.MessageType.Valid() {
			t.Fatalf("accepted messageType %q", m.MessageType)
		}
		if a := m.SenderAddress; a != nil && (a.Port < 0 || a.Port > 65535 || len(a.Host) > MaxHostBytes) {
			t.Fatalf("accepted senderAddress %+v", a)
		}
		enc, err := Encode(m)
		if err != nil {
			t.Fatalf("encode %+v: %v", m, err)
		}
		back, err := Decode(enc)
		if err != nil {
			t.Fatalf("decode of own encoding %s: %v", enc, err)
		}
		if back.MessageType != m.MessageType || back.RequestID != m.RequestID || back.Path != m.Path ||
			back.ErrorMessage != m.ErrorMessage || (back.SenderAddress == nil) != (m.SenderAddress == nil) ||
			back.SenderAddress != nil && *back.SenderAddress != *m.SenderAddress {
			t.Fatalf("round trip changed %+v into %+v", m, back)
		}
		var compact bytes.Buffer
		if len(m.Payload) > 0 {
			if err := json.Compact(&compact, m.Payload); err != nil {
				t.Fatalf("payload %q: %v", m.Payload, err)
			}
		}
		if !bytes.Equal(back.Payload, compact.Bytes()) && !(len(back.Payload) == 0 && compact.Len() == 0) {
			t.Fatalf("payload %s came back as %s", compact.Bytes(), back.Payload)
		}
		again, err := Encode(back)
		if err != nil || !bytes.Equal(again, enc) {
			t.Fatalf("encoding is not stable: %s then %s (%v)", enc, again, err)
		}
	})
}
