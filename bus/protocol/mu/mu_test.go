package mu

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		want     *Message // nil: refused
		refusal  string
	}{
		{name: "JacksonNulls", in: `{"messageType":"HEARTBEAT","requestId":null,"path":null,"senderAddress":{"host":"10.0.0.5","port":27777},"payload":null,"errorMessage":null}`,
			want: &Message{MessageType: TypeHeartbeat, SenderAddress: &Address{Host: "10.0.0.5", Port: 27777}}},
		{name: "Ask", in: `{"messageType":"ASK","requestId":"r","path":"p@a:1","payload":{"k":[1]}}`,
			want: &Message{MessageType: TypeAsk, RequestID: "r", Path: "p@a:1", Payload: json.RawMessage(`{"k":[1]}`)}},
		{name: "UnknownFieldIgnored", in: `{"messageType":"TELL","extra":1}`, want: &Message{MessageType: TypeTell}},
		{name: "WrongCase", in: `{"messageType":"TELL","Path":"x"}`, refusal: `field "Path" must be spelled "path"`},
		{name: "KelvinFold", in: "{\"messageType\":\"TELL\",\"reque\u017ftId\":\"x\"}", refusal: "must be spelled"},
		{name: "NoType", in: `{}`, refusal: "no messageType"},
		{name: "NullType", in: `{"messageType":null}`, refusal: "no messageType"},
		{name: "UnknownType", in: `{"messageType":"SHOUT"}`, refusal: "unknown messageType"},
		{name: "NotObject", in: `null`, refusal: "not a JSON object"},
		{name: "Trailing", in: `{"messageType":"TELL"}x`, refusal: "invalid character"},
		{name: "Port", in: `{"messageType":"HEARTBEAT","senderAddress":{"host":"h","port":-1}}`, refusal: "port -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode([]byte(tc.in))
			if tc.want == nil {
				if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.refusal) {
					t.Fatalf("got %+v, %v; want a refusal with %q", got, err, tc.refusal)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			a, _ := json.Marshal(got)
			b, _ := json.Marshal(tc.want)
			if string(a) != string(b) {
				t.Fatalf("got %s, want %s", a, b)
			}
		})
	}
}

// TestEncodeFieldNames: PowerJob's field names, zero fields left out (Jackson reads
// them as null).
func TestEncodeFieldNames(t *testing.T) {
	t.Parallel()
	got, err := Encode(&Message{MessageType: TypeError, RequestID: "r", Path: "p", SenderAddress: &Address{Host: "h", Port: 1},
		Payload: json.RawMessage(`1`), ErrorMessage: "e"})
	want := `{"messageType":"ERROR","requestId":"r","path":"p","senderAddress":{"host":"h","port":1},"payload":1,"errorMessage":"e"}`
	if err != nil || string(got) != want {
		t.Fatalf("got %s, %v\nwant %s", got, err, want)
	}
	if got, _ := Encode(&Message{MessageType: TypeHeartbeat}); string(got) != `{"messageType":"HEARTBEAT"}` {
		t.Fatalf("got %s", got)
	}
}
