package protocol_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

func TestParseCanonicalTaskAssign(t *testing.T) {
	encoded := func(m protocol.TaskAssign) string {
		data, err := protocol.Encode(&m)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	base := protocol.TaskAssign{JobID: "j-1", AttemptID: "a-1", AttemptNumber: 3, TaskType: "SHA256", Payload: json.RawMessage(`{"data":"x y"}`)}
	tests := []struct {
		name string
		data string
		ok   bool
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
		{"another type", `{"type":"TASK_CANCEL","jobId":"j","attemptId":"a"}`, false},
		{"truncated", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"T","payload":`, false},
		{"empty", ``, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ok := protocol.ParseCanonicalTaskAssign([]byte(tt.data))
			if ok != tt.ok {
				t.Fatalf("ParseCanonicalTaskAssign(%s) ok = %v, want %v", tt.data, ok, tt.ok)
			}
			checkCanonical(t, []byte(tt.data))
		})
	}
}

func TestParseCanonicalTaskResult(t *testing.T) {
	encoded := func(m protocol.TaskResult) string {
		data, err := protocol.Encode(&m)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	text, quoted := "0123abcd", `say "hi"`
	tests := []struct {
		name string
		data string
		ok   bool
	}{
		{"success", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Success: true, Result: &text}), true},
		{"failure", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: &text}), true},
		{"permanent", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: &text, Permanent: true}), true},
		{"escaped error", encoded(protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Error: &quoted}), false},
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
			_, ok := protocol.ParseCanonicalTaskResult([]byte(tt.data))
			if ok != tt.ok {
				t.Fatalf("ParseCanonicalTaskResult(%s) ok = %v, want %v", tt.data, ok, tt.ok)
			}
			checkCanonical(t, []byte(tt.data))
		})
	}
}

func TestParseCanonicalResultAck(t *testing.T) {
	tests := []struct {
		data string
		ok   bool
	}{
		{`{"jobId":"j-1","accepted":true}`, true},
		{`{"jobId":"j-1","accepted":false}`, true},
		{`{"jobId":"j-1","accepted":true} `, false},
		{`{"accepted":true,"jobId":"j-1"}`, false},
		{`{"jobId":"j\u002d1","accepted":true}`, false},
		{`{"jobId":"j-1","accepted":1}`, false},
		{`{"jobId":"j-1"}`, false},
	}
	for _, tt := range tests {
		if _, ok := protocol.ParseCanonicalResultAck([]byte(tt.data)); ok != tt.ok {
			t.Errorf("ParseCanonicalResultAck(%s) ok = %v, want %v", tt.data, ok, tt.ok)
		}
		checkCanonical(t, []byte(tt.data))
	}
}

// FuzzParseCanonical checks the promise of the canonical parsers on arbitrary bytes:
// whatever they accept, Decode accepts as the same message, and Encode writes back
// byte for byte.
func FuzzParseCanonical(f *testing.F) {
	for _, s := range []string{
		`{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"SHA256","payload":{"data":"abc"}}`,
		`{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":0,"taskType":"T","payload":null}`,
		`{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"T","payload":["\u003c",{"k":"v\"w"}]}`,
		`{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":true,"result":"r","error":null}`,
		`{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":false,"result":null,"error":"e","permanent":true}`,
		`{"jobId":"j","accepted":true}`,
		`{"jobId":"j","accepted":false}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkCanonical(t, data)
	})
}

// checkCanonical fails t when a canonical parser accepts data that Decode reads
// otherwise, or that Encode would not write back unchanged.
func checkCanonical(t *testing.T, data []byte) {
	t.Helper()
	check := func(got protocol.Message) {
		t.Helper()
		want, err := protocol.Decode(data)
		if err != nil {
			t.Fatalf("accepted %q, which Decode rejects: %v", data, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("read %q as\n  %#v\nDecode reads\n  %#v", data, got, want)
		}
		again, err := protocol.Encode(got)
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("accepted %q, which Encode writes as %q (%v)", data, again, err)
		}
	}
	if m, ok := protocol.ParseCanonicalTaskAssign(data); ok {
		check(&m)
	}
	if m, ok := protocol.ParseCanonicalTaskResult(data); ok {
		check(&m)
	}
	if ack, ok := protocol.ParseCanonicalResultAck(data); ok {
		var want protocol.ResultAck
		if err := json.Unmarshal(data, &want); err != nil || ack != want {
			t.Fatalf("read %q as %+v; json.Unmarshal reads %+v (%v)", data, ack, want, err)
		}
		again, err := json.Marshal(ack)
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("accepted %q, which encoding/json writes as %q (%v)", data, again, err)
		}
	}
}
