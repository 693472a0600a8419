package coordinator

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestPubAckRead: pubAck reads JetStream's acknowledgements as nats.go reads them: the
// sequence of a stored message, or the API's error, and refuses what is not one.
func TestPubAckRead(t *testing.T) {
	for _, tt := range []struct {
		data string
		seq  uint64
		code jetstream.ErrorCode // of the API's error; 0 for none
		bad  bool
	}{
		{data: `{"stream":"KV_JOBS","seq":12}`, seq: 12},
		{data: `{"stream":"KV_JOBS","seq":18446744073709551615}`, seq: math.MaxUint64},
		{data: `{"stream":"KV_JOBS","domain":"hub","seq":7,"duplicate":true}`, seq: 7},
		{data: `{"stream":"KV_JOBS", "seq": 9}`, seq: 9},
		{data: `{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"},"stream":"KV_JOBS","seq":0}`, code: 10071},
		{data: `{"stream":"KV_JOBS","seq":1e3}`, bad: true},
		{data: `{"stream":"KV_JOBS","seq":-1}`, bad: true},
		{data: `{"stream":"KV_JOBS","seq":99999999999999999999}`, bad: true},
		{data: `{"stream":"KV_JOBS","seq":3`, bad: true},
		{data: `not json`, bad: true},
	} {
		var ack pubAck
		err := json.Unmarshal([]byte(tt.data), &ack)
		if (err != nil) != tt.bad {
			t.Errorf("%s: error %v, want one: %v", tt.data, err, tt.bad)
			continue
		}
		code := jetstream.ErrorCode(0)
		if ack.Error != nil {
			code = ack.Error.ErrorCode
		}
		if !tt.bad && (ack.Sequence != tt.seq || code != tt.code) {
			t.Errorf("%s: read seq %d, error %v; want seq %d, error code %d", tt.data, ack.Sequence, ack.Error, tt.seq, tt.code)
		}
	}
}
