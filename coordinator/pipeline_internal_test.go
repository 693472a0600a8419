package coordinator

import (
	"encoding/json"
	"testing"
)

// TestPubAckRead: pubAck.read reads what json.Unmarshal reads from JetStream's
// acknowledgements, and refuses what it refuses.
func TestPubAckRead(t *testing.T) {
	for _, data := range []string{
		`{"stream":"KV_JOBS","seq":12}`,
		`{"stream":"KV_JOBS","seq":18446744073709551615}`,
		`{"stream":"KV_JOBS","domain":"hub","seq":7,"duplicate":true}`,
		`{"stream":"KV_JOBS", "seq": 9}`,
		`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"},"stream":"KV_JOBS","seq":0}`,
		`{"stream":"KV_JOBS","seq":1e3}`,
		`{"stream":"KV_JOBS","seq":-1}`,
		`{"stream":"KV_JOBS","seq":99999999999999999999}`,
		`{"stream":"KV_JOBS","seq":3`,
		`not json`,
	} {
		var got, want pubAck
		gerr, werr := got.read([]byte(data)), json.Unmarshal([]byte(data), &want)
		if (gerr == nil) != (werr == nil) || got.Seq != want.Seq || (got.Error == nil) != (want.Error == nil) ||
			(got.Error != nil && *got.Error != *want.Error) {
			t.Errorf("%s: read %+v, %v; json.Unmarshal %+v, %v", data, got, gerr, want, werr)
		}
	}
}
