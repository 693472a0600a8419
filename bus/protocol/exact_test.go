package protocol_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestDecodeExact: DecodeExact calls exact the bytes Encode writes, and only those
// (checkExact), with the escapes Encode writes in strings; it errs on the safe side for
// a negative integer and for strings beyond ASCII.
func TestDecodeExactTaskAssign(t *testing.T) {
	encoded := func(m protocol.TaskAssign) string {
		data, err := protocol.Encode(&m)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	base := protocol.TaskAssign{JobID: "j-1", AttemptID: "a-1", AttemptNumber: 3, TaskType: "SHA256", Payload: json.RawMessage(`{"data":"x y"}`)}
	tests := []struct {
		name  string
		data  string
		exact bool
	}{
		{"as encoded", encoded(base), true},
		{"null payload", encoded(protocol.TaskAssign{JobID: "j", AttemptID: "a", TaskType: "T"}), true},
		{"array payload with escapes in strings", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":10,"taskType":"T","payload":["a\"b\\",1.5e3,null,true]}`, true},
		{"payload with spaces", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"T","payload":{"data": "x"}}`, false},
		{"payload Encode escapes", encoded(protocol.TaskAssign{JobID: "j", AttemptID: "a", TaskType: "T", Payload: json.RawMessage(`"<b>"`)}), true},
		{"payload with raw <", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"T","payload":"<b>"}`, false},
		{"payload with raw U+2028", "{\"type\":\"TASK_ASSIGN\",\"jobId\":\"j\",\"attemptId\":\"a\",\"attemptNumber\":1,\"taskType\":\"T\",\"payload\":\"\u2028\"}", false},
		{"invalid payload", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"T","payload":{"a":}}`, false},
		{"member after payload", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"T","payload":{},"x":1}`, false},
		{"escaped id", `{"type":"TASK_ASSIGN","jobId":"j\u0031","attemptId":"a","attemptNumber":1,"taskType":"T","payload":{}}`, false},
		{"non-ASCII id", `{"type":"TASK_ASSIGN","jobId":"é","attemptId":"a","attemptNumber":1,"taskType":"T","payload":{}}`, false},
		{"negative attempt", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":-1,"taskType":"T","payload":{}}`, false},
		{"leading zero", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":01,"taskType":"T","payload":{}}`, false},
		{"fraction", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1.0,"taskType":"T","payload":{}}`, false},
		{"overflowing attempt", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":99999999999999999999,"taskType":"T","payload":{}}`, false},
		{"attempt as string", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":"1","taskType":"T","payload":{}}`, false},
		{"fields reordered", `{"type":"TASK_ASSIGN","attemptId":"a","jobId":"j","attemptNumber":1,"taskType":"T","payload":{}}`, false},
		{"trailing newline", encoded(base) + "\n", false},
		{"with trace context", encoded(protocol.TaskAssign{JobID: "j", AttemptID: "a", TaskType: "T", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", TraceState: "k=v"}), true},
		{"with traceparent only", encoded(protocol.TaskAssign{JobID: "j", AttemptID: "a", TaskType: "T", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}), true},
		{"empty traceparent", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"T","payload":{},"traceparent":""}`, false},
		{"tracestate without traceparent", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"T","payload":{},"tracestate":"k=v"}`, false},
		{"another type", `{"type":"TASK_CANCEL","jobId":"j","attemptId":"a"}`, false},
		{"truncated", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"T","payload":`, false},
		{"empty", ``, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, exact, _ := protocol.DecodeExact([]byte(tt.data))
			if _, assign := m.(*protocol.TaskAssign); exact != tt.exact || exact && !assign {
				t.Fatalf("DecodeExact(%s) = %T, exact %v; want exact %v", tt.data, m, exact, tt.exact)
			}
			checkExact(t, []byte(tt.data))
		})
	}
}

func TestDecodeExactTaskResult(t *testing.T) {
	encoded := func(m protocol.TaskResult) string {
		data, err := protocol.Encode(&m)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	text, quoted, html := "0123abcd", `say "hi"`, "<b>\x01\n & co</b>"
	tests := []struct {
		name  string
		data  string
		exact bool
	}{
		{"success", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Success: true, Result: &text}), true},
		{"failure", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: &text}), true},
		{"permanent", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: &text, Permanent: true}), true},
		// Read right, but a member after an omitted one is not where the layout has it:
		// left inexact (snoozes are rare).
		{"snooze", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: &text, SnoozeMillis: 1500}), false},
		{"permanent and snooze", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: &text, Permanent: true, SnoozeMillis: 1}), true},
		{"snooze 0 written", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":false,"result":null,"error":null,"snoozeMillis":0}`, false},
		{"escaped error", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: &quoted}), true},
		{"error with what Encode escapes", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: &html}), true},
		{"escape Encode does not write", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":false,"result":null,"error":"a\/b"}`, false},
		{"quote as a unicode escape", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":false,"result":null,"error":"\u0022"}`, false},
		{"upper-case unicode escape", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":false,"result":null,"error":"\u003C"}`, false},
		{"raw <", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":false,"result":null,"error":"<"}`, false},
		{"permanent false written", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":false,"result":null,"error":null,"permanent":false}`, false},
		{"spec peer without result", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":true}`, false},
		{"success as string", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":"true","result":null,"error":null}`, false},
		{"result as number", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":true,"result":1,"error":null}`, false},
		{"spaces", `{"type":"TASK_RESULT", "workerId":"w","jobId":"j","attemptId":"a","success":true,"result":null,"error":null}`, false},
		{"trailing bytes", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a"}) + " ", false},
		{"truncated", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":true,"result":null,"error":null`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, exact, _ := protocol.DecodeExact([]byte(tt.data))
			if _, result := m.(*protocol.TaskResult); exact != tt.exact || exact && !result {
				t.Fatalf("DecodeExact(%s) = %T, exact %v; want exact %v", tt.data, m, exact, tt.exact)
			}
			checkExact(t, []byte(tt.data))
		})
	}
}

// checkExact fails t when DecodeExact calls data exact but Decode reads it otherwise,
// or Encode would not write it back byte for byte. FuzzDecode runs it on every input.
func checkExact(t *testing.T, data []byte) {
	t.Helper()
	got, exact, err := protocol.DecodeExact(data)
	want, werr := protocol.Decode(data)
	if fmt.Sprint(err) != fmt.Sprint(werr) || !reflect.DeepEqual(got, want) {
		t.Fatalf("DecodeExact(%q) = %#v, %v; Decode %#v, %v", data, got, err, want, werr)
	}
	if !exact {
		return
	}
	if err != nil {
		t.Fatalf("exact %q, which Decode rejects: %v", data, err)
	}
	again, err := protocol.Encode(got)
	if err != nil || !bytes.Equal(again, data) {
		t.Fatalf("exact %q, which Encode writes as %q (%v)", data, again, err)
	}
}
