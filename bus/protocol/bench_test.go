package protocol_test

import (
	"encoding/json"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

func BenchmarkDecodeTaskResult(b *testing.B) {
	data := []byte(`{"type":"TASK_RESULT","workerId":"worker-1","jobId":"7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a69","attemptId":"0b8e6f4d-2c3a-4e1f-8d7c-6b5a49382716","success":true,"result":"{\"words\":1234}","error":null}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := protocol.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeTaskAssign(b *testing.B) {
	m := &protocol.TaskAssign{
		JobID:         "7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a69",
		AttemptID:     "0b8e6f4d-2c3a-4e1f-8d7c-6b5a49382716",
		AttemptNumber: 1,
		TaskType:      "WORD_COUNT",
		Payload:       json.RawMessage(`{"text":"the quick brown fox jumps over the lazy dog"}`),
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := protocol.Encode(m); err != nil {
			b.Fatal(err)
		}
	}
}

// The worker port's hot messages as the bridge reads them: Decode, and DecodeExact,
// which also says whether the bytes may be forwarded as they are.
var (
	benchAssign = []byte(`{"type":"TASK_ASSIGN","jobId":"7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a69","attemptId":"0b8e6f4d-2c3a-4e1f-8d7c-6b5a49382716","attemptNumber":1,"taskType":"SHA256","payload":{"data":"the quick brown fox jumps over the lazy dog","iterations":1}}`)
	benchResult = []byte(`{"type":"TASK_RESULT","workerId":"worker-1","jobId":"7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a69","attemptId":"0b8e6f4d-2c3a-4e1f-8d7c-6b5a49382716","success":true,"result":"05c6e08f1d9fdafa03147fcb8f82f124c76d2f70e3d989dc8aadb5e7d7450bec","error":null}`)
)

func BenchmarkWorkerPortDecode(b *testing.B) {
	for _, m := range []struct {
		name string
		data []byte
	}{{"assign", benchAssign}, {"result", benchResult}} {
		b.Run(m.name+"/Decode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := protocol.Decode(m.data); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(m.name+"/DecodeExact", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, exact, err := protocol.DecodeExact(m.data); err != nil || !exact {
					b.Fatal("not exact", err)
				}
			}
		})
	}
}

func BenchmarkResultAckDecode(b *testing.B) {
	data := []byte(`{"jobId":"7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a69","accepted":true}`)
	b.Run("Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var ack protocol.ResultAck
			if err := json.Unmarshal(data, &ack); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DecodeJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var ack protocol.ResultAck
			if err := ack.DecodeJSON(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
