package protocol_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

func TestParseState(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want protocol.State
	}{
		{"QUEUED", protocol.StateQueued},
		{"running", protocol.StateRunning},
		{"Retry_Wait", protocol.StateRetryWait},
		{"completed", protocol.StateCompleted},
		{"FAILED", protocol.StateFailed},
		{"cAnCeLlEd", protocol.StateCancelled},
	}
	for _, tc := range tests {
		got, err := protocol.ParseState(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseState(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "DONE", "RETRY WAIT", "RETRYWAIT", " QUEUED"} {
		if got, err := protocol.ParseState(bad); err == nil {
			t.Errorf("ParseState(%q) = %q, want an error", bad, got)
		}
	}
}

func TestParsePriority(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want protocol.Priority
	}{
		{"HIGH", protocol.PriorityHigh},
		{"high", protocol.PriorityHigh},
		{"Normal", protocol.PriorityNormal},
		{"low", protocol.PriorityLow},
	}
	for _, tc := range tests {
		got, err := protocol.ParsePriority(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParsePriority(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "URGENT", "1", "HIGHEST"} {
		if got, err := protocol.ParsePriority(bad); err == nil {
			t.Errorf("ParsePriority(%q) = %q, want an error", bad, got)
		}
	}
}

func TestPriorityLevel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		p    protocol.Priority
		want int
	}{
		{protocol.PriorityHigh, 2},
		{protocol.PriorityNormal, 1},
		{protocol.PriorityLow, 0},
		{"", 1}, // absent means NORMAL
	}
	for _, tc := range tests {
		if got := tc.p.Level(); got != tc.want {
			t.Errorf("%q.Level() = %d, want %d", tc.p, got, tc.want)
		}
	}
}

func TestOrNormal(t *testing.T) {
	t.Parallel()
	if got := protocol.OrNormal(nil); got != protocol.PriorityNormal {
		t.Errorf("OrNormal(nil) = %q, want NORMAL", got)
	}
	if got := protocol.OrNormal(ptr(protocol.PriorityLow)); got != protocol.PriorityLow {
		t.Errorf("OrNormal(LOW) = %q, want LOW", got)
	}
}

func TestStateTerminalAndActive(t *testing.T) {
	t.Parallel()
	tests := []struct {
		s        protocol.State
		terminal bool
	}{
		{protocol.StateScheduled, false},
		{protocol.StateWaiting, false},
		{protocol.StateQueued, false},
		{protocol.StateRunning, false},
		{protocol.StateRetryWait, false},
		{protocol.StateCompleted, true},
		{protocol.StateFailed, true},
		{protocol.StateCancelled, true},
	}
	if len(tests) != len(protocol.States) {
		t.Fatalf("States has %d entries, the spec and its extensions have %d", len(protocol.States), len(tests))
	}
	for i, tc := range tests {
		if protocol.States[i] != tc.s {
			t.Errorf("States[%d] = %s, want %s (lifecycle order)", i, protocol.States[i], tc.s)
		}
		if got := tc.s.Terminal(); got != tc.terminal {
			t.Errorf("%s.Terminal() = %v, want %v", tc.s, got, tc.terminal)
		}
		// Every state is exactly one of active and terminal.
		if got := tc.s.Active(); got == tc.terminal {
			t.Errorf("%s.Active() = %v, want %v", tc.s, got, !tc.terminal)
		}
	}
	if protocol.State("").Terminal() || protocol.State("").Active() {
		t.Error("the empty state is neither terminal nor active")
	}
}

func TestPriorityUnmarshalJSON(t *testing.T) {
	t.Parallel()
	for _, in := range []string{`"HIGH"`, `"NORMAL"`, `"LOW"`} {
		var p protocol.Priority
		if err := json.Unmarshal([]byte(in), &p); err != nil || `"`+string(p)+`"` != in {
			t.Errorf("Unmarshal(%s) = %q, %v", in, p, err)
		}
	}
	// null leaves the value alone, as encoding/json does for its own types.
	p := protocol.PriorityLow
	if err := json.Unmarshal([]byte(`null`), &p); err != nil || p != protocol.PriorityLow {
		t.Errorf("Unmarshal(null) = %q, %v; want LOW unchanged", p, err)
	}
	for _, in := range []string{`"high"`, `"URGENT"`, `""`, `2`, `true`, `{}`} {
		var p protocol.Priority
		if err := json.Unmarshal([]byte(in), &p); err == nil {
			t.Errorf("Unmarshal(%s) = %q, want an error", in, p)
		}
	}
}

func TestErrorIsAGoError(t *testing.T) {
	t.Parallel()
	var err error = &protocol.Error{Message: "Unknown job: j1"}
	if err.Error() != "Unknown job: j1" {
		t.Errorf("Error() = %q", err.Error())
	}
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Message != "Unknown job: j1" {
		t.Errorf("errors.As did not find the protocol error")
	}
}

// A SUBMIT_JOB's extension members survive Decode: the hot path's scanner skips members
// it does not know, so a submission carrying one is read by encoding/json.
func TestSubmitExtensionsDecode(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"a"},"maxAttempts":0,"idempotencyKey":null,"priority":null,"after":["p1","p2"],"afterAnyEnd":true,"queue":"low","runInMillis":5}`,
		`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"a"},"after":["p1","p2"],"afterAnyEnd":true,"queue":"low","runInMillis":5}`,
	} {
		m, err := protocol.Decode([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		s := m.(*protocol.SubmitJob)
		if len(s.After) != 2 || s.After[1] != "p2" || !s.AfterAnyEnd || s.Queue != "low" || s.RunInMillis != 5 {
			t.Errorf("decoded %+v from %s, want after [p1 p2], afterAnyEnd, queue low, runInMillis 5", s, body)
		}
	}
}
