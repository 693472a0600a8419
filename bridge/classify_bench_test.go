package bridge

import (
	"bytes"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// BenchmarkClassifyClient compares the full decode the client port made of every
// request with the peek at its type it makes now (the coordinator decodes it anyway).
func BenchmarkClassifyClient(b *testing.B) {
	payload := []byte(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"job 12345 of the benchmark"},"maxAttempts":0,"idempotencyKey":null,"priority":null}`)
	decode := func(payload []byte) (verdict, string, *protocol.Error) {
		msg, err := protocol.Decode(payload)
		if err != nil {
			return reject, "", protocol.MalformedRequest(err)
		}
		e, ok := protocol.EndpointFor(msg.MessageType())
		if !ok {
			return answer, "", protocol.UnexpectedType(msg.MessageType(), "client")
		}
		return forward, e.Subject(), nil
	}
	for _, c := range []struct {
		name     string
		classify func([]byte) (verdict, string, *protocol.Error)
	}{{"Decode", decode}, {"Peek", classifyClient}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if v, _, _ := c.classify(payload); v != forward {
					b.Fatal(v)
				}
			}
		})
	}
}

// BenchmarkWorkerPortHotPath compares, per job, what the worker port did with a
// TASK_ASSIGN from the coordinator and a TASK_RESULT from the worker (decode, then
// encode again) with what it does now (read the message and whether Encode would write
// the same bytes, forward them).
func BenchmarkWorkerPortHotPath(b *testing.B) {
	assign := []byte(`{"type":"TASK_ASSIGN","jobId":"7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a69","attemptId":"0b8e6f4d-2c3a-4e1f-8d7c-6b5a49382716","attemptNumber":1,"taskType":"SHA256","payload":{"text":"job 12345 of the benchmark"}}`)
	result := []byte(`{"type":"TASK_RESULT","workerId":"bench-worker","jobId":"7f3c2a9e-5b1d-4c8e-9a0f-1e2d3c4b5a69","attemptId":"0b8e6f4d-2c3a-4e1f-8d7c-6b5a49382716","success":true,"result":"05c6e08f1d9fdafa03147fcb8f82f124c76d2f70e3d989dc8aadb5e7d7450bec","error":null}`)
	decodeEncode := func(data []byte) {
		m, err := protocol.Decode(data)
		if err == nil {
			_, err = protocol.Encode(m)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Run("assign/DecodeEncode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			decodeEncode(assign)
		}
	})
	b.Run("assign/Relayed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := relayed(protocol.TypeTaskAssign, assign); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("result/DecodeEncode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			decodeEncode(result)
		}
	})
	b.Run("result/DecodeExact", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, exact, err := protocol.DecodeExact(result); err != nil || !exact {
				b.Fatal("not exact", err)
			}
			_ = bytes.Clone(result) // kept for the delivery
		}
	})
}
