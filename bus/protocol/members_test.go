package protocol_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestDecodeMatchesMemberNamesAsWritten: a member whose name matches a field's only when
// case is folded (ASCII, escaped, or through the Kelvin sign) is an unknown member:
// Decode ignores it, as the spec's peers do, where encoding/json would read it into the
// field. What it drops changes nothing else: the other members, duplicates and errors
// stay encoding/json's.
func TestDecodeMatchesMemberNamesAsWritten(t *testing.T) {
	t.Parallel()
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		name string
		data string
		want protocol.Message
	}{
		{"ReplacesNothing", `{"type":"GET_JOB_STATUS","jobId":"a","JobId":"b","JOBID":"c"}`, &protocol.GetJobStatus{JobID: "a"}},
		{"StandsInForNothing", `{"type":"GET_JOB_STATUS","JobId":"b"}`, &protocol.GetJobStatus{}},
		{"Escaped", `{"type":"GET_JOB_STATUS","jobId":"a","\u004aobId":"b"}`, &protocol.GetJobStatus{JobID: "a"}},
		{"EscapedExact", `{"type":"GET_JOB_STATUS","job\u0049d":"a"}`, &protocol.GetJobStatus{JobID: "a"}},
		{"KelvinSign", "{\"type\":\"HEARTBEAT\",\"workerId\":\"w\",\"wor\u212aerId\":\"x\"}", &protocol.Heartbeat{WorkerID: "w"}},
		{"WrongTypeIgnored", `{"type":"WORKER_REGISTER","workerId":"w","capacity":2,"Capacity":"x"}`, &protocol.WorkerRegister{WorkerID: "w", Capacity: 2}},
		{"HotMessage", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":true,"Success":false,"result":"r","Result":"R","error":null,"Error":"e"}`,
			&protocol.TaskResult{WorkerID: "w", JobID: "j", AttemptID: "a", Success: true, Result: str("r")}},
		{"DuplicatesStillLastWins", `{"type":"GET_JOB_STATUS","jobId":"a","JOBID":"x","jobId":"b"}`, &protocol.GetJobStatus{JobID: "b"}},
		{"InValuesUntouched", `{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"TaskType":"x","text":"TASKTYPE"},"maxAttempts":1}`,
			&protocol.SubmitJob{TaskType: "SHA256", Payload: []byte(`{"TaskType":"x","text":"TASKTYPE"}`), MaxAttempts: 1}},
		{"TypeAfterOthers", `{"jobId":"a","TYPE":"HEARTBEAT","type":"GET_JOB_STATUS","Type":"CANCEL_JOB"}`, &protocol.GetJobStatus{JobID: "a"}},
		{"TypeFirst", `{"type":"GET_JOB_STATUS","Type":"CANCEL_JOB","jobId":"a"}`, &protocol.GetJobStatus{JobID: "a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := protocol.Decode([]byte(tc.data))
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Decode(%s) = %#v, %v; want %#v", tc.data, got, err, tc.want)
			}
		})
	}
	for _, data := range []string{
		`{"TYPE":"LIST_WORKERS"}`,                                   // no "type"
		`{"Type":"HEARTBEAT","workerId":"w"}`,                       // no "type"
		`{"type":"GET_JOB_STATUS","JobId":"b","jobId":5}`,           // still a wrong type
		`{"type":"GET_JOB_STATUS","jobId":"a","JobId":"b"} x`,       // still bytes after the object
		`{"type":"GET_JOB_STATUS","jobId":"a","JobId":"b",}`,        // still not JSON
		`{"workerId":"w","TYPE":"HEARTBEAT","type":"NO_SUCH_TYPE"}`, // still unknown
	} {
		if m, err := protocol.Decode([]byte(data)); err == nil || !errors.Is(err, protocol.ErrMalformed) {
			t.Errorf("Decode(%s) = %#v, %v; want a malformed message", data, m, err)
		}
	}
}
