package coordinator

import (
	"encoding/json"
	"testing"
)

// ackSamples are acknowledgements as nats-server writes them (stream.go), and others.
var ackSamples = []string{
	`{"stream":"KV_JOBS","seq":1}`,
	`{"stream":"KV_JOBS","seq":18446744073709551615}`, // 20 digits: encoding/json's
	`{"stream":"KV_JOBS","seq":1234567890123456789}`,
	`{"stream":"KV_JOBS","domain":"hub","seq":42}`,
	`{"stream":"KV_JOBS","seq":42,"duplicate": true}`,
	`{"stream":"KV_JOBS","seq":42,"batch":"b1","count":3}`,
	`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 41"}}`,
	`{"stream":"KV_JOBS","seq":42,"error":{"code":503,"description":"x"}}`,
	`{"stream":"KV_\u004aOBS","seq":7}`,
	`{"stream":"KV_JOBS","seq":007}`,
	`{"stream":"KV_JOBS","seq":-1}`,
	`{"stream":"KV_JOBS","seq":1} `,
	`{"stream":"KV_JOBS","seq":}`,
	`{"stream":"KV_JOBS"}`,
	`{"stream":"KV_JOBS","seq":1`,
	`{"stream":"KV`,
	``,
}

// TestAckSeq: whatever ackSeq reads, encoding/json reads the same, as a success.
func TestAckSeq(t *testing.T) {
	want := map[string]uint64{
		`{"stream":"KV_JOBS","seq":1}`:                   1,
		`{"stream":"KV_JOBS","seq":1234567890123456789}`: 1234567890123456789,
		`{"stream":"KV_JOBS","domain":"hub","seq":42}`:   42,
	}
	for _, s := range ackSamples {
		seq, ok := ackSeq([]byte(s))
		if w, plain := want[s]; ok != plain || seq != w {
			t.Errorf("ackSeq(%s) = %d, %v; want %d, %v", s, seq, ok, w, plain)
		}
		checkAckSeq(t, []byte(s))
	}
}

func FuzzAckSeq(f *testing.F) {
	for _, s := range ackSamples {
		f.Add([]byte(s))
	}
	f.Fuzz(checkAckSeq)
}

// checkAckSeq fails when ackSeq reads data other than encoding/json does.
func checkAckSeq(t *testing.T, data []byte) {
	seq, ok := ackSeq(data)
	if !ok {
		return
	}
	var ack pubAck
	if err := json.Unmarshal(data, &ack); err != nil || ack.Error != nil || ack.Sequence != seq {
		t.Fatalf("ackSeq(%s) = %d; encoding/json: %d, error %v, err %v", data, seq, ack.Sequence, ack.Error, err)
	}
}

func BenchmarkAckDecode(b *testing.B) {
	data := []byte(`{"stream":"KV_JOBS","seq":1234567}`)
	b.Run("ackSeq", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := ackSeq(data); !ok {
				b.Fatal("not read")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var ack pubAck
			if err := json.Unmarshal(data, &ack); err != nil {
				b.Fatal(err)
			}
		}
	})
}
