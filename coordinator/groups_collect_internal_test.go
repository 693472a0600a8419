package coordinator

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestGroupsCollectedOnceTheirStepsExpired: a coordinator leading for long forgets a
// workflow whose steps all expired without anyone asking about it (the sweeper's
// collect), its control with it; one whose step is still kept it keeps.
func TestGroupsCollectedOnceTheirStepsExpired(t *testing.T) {
	b := newMemBackend()
	s := startMem(t, b, func(c *Config) { c.Retention = 2 * time.Minute })
	s.register("w", 2)
	submit := func(id string) {
		t.Helper()
		got := make(chan protocol.Message, 1)
		req := &protocol.SubmitWorkflow{WorkflowID: id, Steps: []protocol.WorkflowStep{
			{Name: "a", TaskType: "SHA256", Payload: json.RawMessage(`{"text":"` + id + `"}`)}}}
		s.c.api.serveWorkflow(req, request{due: time.Second}, func(m protocol.Message) { got <- answerOf(m) })
		if m, ok := (<-got).(*protocol.WorkflowSubmitted); !ok {
			t.Fatalf("submit %s: %#v", id, m)
		}
		s.done("w", s.assigned("w"))
		s.settle()
	}
	known := func(id string) bool {
		s.sched.mu.Lock()
		defer s.sched.mu.Unlock()
		return s.sched.groups.get(id) != nil
	}
	submit("early")
	s.sweep(40 * time.Second)
	submit("late")
	s.sweep(90 * time.Second) // early's step expired, late's is kept; a collect is due
	eventuallyTrue(t, "early forgotten", func() bool { return !known("early") })
	if !known("late") {
		t.Fatal("late forgotten while its step is kept")
	}
	b.mu.Lock()
	_, stored := b.controls[controlKey(protocol.KindWorkflow, "early")]
	b.mu.Unlock()
	if stored {
		t.Error("early's control still stored")
	}
}
