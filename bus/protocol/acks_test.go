package protocol

import (
	"encoding/json"
	"reflect"
	"testing"
)

var acksSeeds = []string{
	`{"acks":[{"jobId":"j","accepted":true}]}`,
	`{"acks":[{"jobId":"j","accepted":true},{"jobId":"k","accepted":false,"code":503,"error":"not durable \u003cyet\u003e"},{"jobId":"l","accepted":false,"code":403}]}`,
	`{"acks":[]}`,
	`{"acks":null}`,
	`{"acks":[null]}`,
	`{"acks":[{}]}`,
	`{"acks":[1]}`,
	`{"acks":[{"jobId":"j"},]}`,
	`{"acks":[{"jobId":"j"}]} `,
	`{"acks":[{"jobId":"j"}]`,
	`{"acks":[{"jobId":"j","code":1.5}]}`,
	`{"acks":[{"jobId":"j","accepted":null,"error":null}]}`,
	`{"acks":[{"jobId":"j","jobId":"k","other":[1,{"a":2}]}]}`,
	`{"acks":[{"JOBID":"j","Accepted":true}]}`,
	`{"acks":[{"jobId":"` + "\xff" + `","accepted":true}]}`,
	`{"acks":[{"jobId":"j\u00e9","accepted":true}]}`,
	`null`, `[]`, `{}`, ``, `{"acks":1}`,
}

// FuzzResultAcksDecode holds ResultAcks' DecodeJSON to json.Unmarshal (the same fields
// set, the same error, from zero answers and from answers already set) and its
// MarshalJSON to encoding/json's encoding of whatever was read. Seeds here and in
// testdata/fuzz/FuzzResultAcksDecode.
func FuzzResultAcksDecode(f *testing.F) {
	for _, s := range acksSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkBatchCodec(t, data, []func() *ResultAcks{
			func() *ResultAcks { return new(ResultAcks) },
			func() *ResultAcks { return &ResultAcks{Acks: []ResultAnswer{{JobID: "j0", Code: 7}}} },
		}, func(m *ResultAcks) ([]byte, error) {
			type plain ResultAcks
			return json.Marshal((*plain)(m))
		})
	})
}

// TestResultAcksRoundTrip: answers as the coordinator writes them are read back whole
// by the one-pass decoder, escapes and all.
func TestResultAcksRoundTrip(t *testing.T) {
	in := ResultAcks{Acks: []ResultAnswer{
		{JobID: "j-1", Accepted: true},
		{JobID: "j-2", Code: 503, Error: `not durable: "store" <full> & é`},
		{JobID: "j-3", Code: 403, Error: "another worker's attempt"},
	}}
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	type plain ResultAcks
	want, _ := json.Marshal(plain(in))
	if string(data) != string(want) {
		t.Fatalf("MarshalJSON %s, encoding/json %s", data, want)
	}
	var out ResultAcks
	if err := out.DecodeJSON(data); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("read back %+v, want %+v", out, in)
	}
	if _, _, ok := scanList[ResultAnswer](data, len(`{"acks":[`)); !ok {
		t.Fatalf("%s was left to encoding/json", data)
	}
}
