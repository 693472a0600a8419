package bridge

import (
	"bytes"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestRelayedAssignLeavesOutTheTraceContext: a spec worker never sees the job's trace
// context (a native extension of TASK_ASSIGN); the rest of the message is unchanged.
func TestRelayedAssignLeavesOutTheTraceContext(t *testing.T) {
	t.Parallel()
	plain := &protocol.TaskAssign{JobID: "j", AttemptID: "a", AttemptNumber: 2, TaskType: "SLEEP", Payload: []byte(`{"durationMillis":1}`)}
	want, err := protocol.Encode(plain)
	if err != nil {
		t.Fatal(err)
	}
	traced := *plain
	traced.TraceParent, traced.TraceState = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v"
	for _, m := range []*protocol.TaskAssign{plain, &traced} {
		data, err := protocol.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		got, ref, err := relayed(protocol.TypeTaskAssign, data)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) || ref.JobID != "j" || ref.AttemptID != "a" {
			t.Fatalf("relayed %s\n as %s\nwant %s", data, got, want)
		}
	}
}
