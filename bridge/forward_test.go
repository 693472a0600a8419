package bridge_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestForwardedUndecoded covers what the bridge forwards without decoding it: client
// requests (the coordinator's answer vouches for them) and results and assignments as
// Encode writes them (protocol.DecodeExact). Anything else must be judged exactly as a
// full decode judges it.
func TestForwardedUndecoded(t *testing.T) {
	t.Parallel()

	t.Run("MalformedRequestClosesWithoutACoordinator", func(t *testing.T) {
		t.Parallel()
		// The type is readable, so the request goes to the coordinator first; nobody
		// answers, and the bridge's own decode still finds it malformed.
		s := setup(t, noCoordinator(), withBridge(func(c *bridgeConfig) { c.RequestTimeout = 100 * time.Millisecond }))
		c := s.client()
		if err := c.SendPayload([]byte(`{"type":"GET_JOB_STATUS","jobId":5}`)); err != nil {
			t.Fatal(err)
		}
		c.ExpectErrorThenClosed("Malformed request: malformed message: GET_JOB_STATUS: field 'jobId' must be a string, got number")
	})

	t.Run("ResultsInAnyLayoutCount", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		w := s.worker("layouts", 4)
		c := s.client()
		for _, tt := range []struct {
			name   string
			format string // jobId, attemptId
			result string
		}{
			{"AsEncoded", `{"type":"TASK_RESULT","workerId":"layouts","jobId":%q,"attemptId":%q,"success":true,"result":"r1","error":null}`, "r1"},
			{"Spaced", `{ "type": "TASK_RESULT", "workerId": "layouts", "jobId": %q, "attemptId": %q, "success": true, "result": "r2", "error": null }`, "r2"},
			{"Reordered", `{"jobId":%q,"attemptId":%q,"type":"TASK_RESULT","workerId":"layouts","success":true,"result":"r3"}`, "r3"},
			{"EscapedResult", `{"type":"TASK_RESULT","workerId":"layouts","jobId":%q,"attemptId":%q,"success":true,"result":"say \"r4\" <b>","error":null}`, `say "r4" <b>`},
			{"AnotherWorkerID", `{"type":"TASK_RESULT","workerId":"someone-else","jobId":%q,"attemptId":%q,"success":true,"result":"r5","error":null}`, "r5"},
		} {
			id := c.Submit("SHA256", fmt.Sprintf(`{"text":%q}`, tt.name))
			a := w.ExpectAssign(id)
			if err := w.SendPayload(fmt.Appendf(nil, tt.format, id, a.AttemptID)); err != nil {
				t.Fatal(err)
			}
			if j := s.waitState(id, protocol.StateCompleted); deref(j.Result) != tt.result || j.Attempts != 1 {
				t.Fatalf("%s: job %+v, want COMPLETED on attempt 1 with result %q", tt.name, j, tt.result)
			}
		}
	})

	t.Run("MalformedResultCloses", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		w := s.worker("sloppy", 1)
		// As Encode writes a result up to the success flag, given as a string.
		if err := w.SendPayload([]byte(`{"type":"TASK_RESULT","workerId":"sloppy","jobId":"j","attemptId":"a","success":"true","result":null,"error":null}`)); err != nil {
			t.Fatal(err)
		}
		w.ExpectErrorThenClosed("Malformed request: malformed message: TASK_RESULT: field 'success' must be a boolean, got string")
	})
}
