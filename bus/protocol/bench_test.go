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
