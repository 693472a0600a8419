package coordinator

import (
	"errors"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// TestGroupOutcomeUnknownNamesTheGroup: the coordinator's "Outcome unknown" answers to
// a workflow's or batch's submission, retry and cancel name the group as the client
// reads it back (client.OutcomeWorkflow), and never as a job: a workflow cancel said
// "job <workflow id>", and a retry's answer was not read at all.
func TestGroupOutcomeUnknownNamesTheGroup(t *testing.T) {
	t.Parallel()
	cause := unknownOutcome(errors.New("no quorum"))
	tests := []struct {
		name string
		msg  protocol.Message
		want string
	}{
		{"Submit", groupNotStored("batch b1", cause), "b1"},
		{"Retry", groupNotStored("retry of workflow w1", cause), "w1"},
		{"Cancel", settled{protocol.OutcomeUnknownGroupCancel(protocol.KindWorkflow, "w2", cause.Error())}, "w2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, ok := tc.msg.(settled)
			if !ok {
				t.Fatalf("%T, want a settled answer", tc.msg)
			}
			err := &client.ServerError{Message: s.Message.(*protocol.Error).Message}
			if !errors.Is(err, client.ErrOutcomeUnknown) {
				t.Fatalf("%q is not Outcome unknown", err)
			}
			if id, ok := client.OutcomeWorkflow(err); !ok || id != tc.want {
				t.Errorf("OutcomeWorkflow(%q) = %q, %v; want %q", err, id, ok, tc.want)
			}
			if id, ok := client.OutcomeJob(err); ok {
				t.Errorf("OutcomeJob(%q) = %q: a group named as a job", err, id)
			}
		})
	}
}

// TestTriggerOutcomeUnknownIsSaid: a trigger whose job's submission was answered
// "Outcome unknown" says so, naming the schedule and that a trigger sent again submits
// another job; it said "trigger not submitted", though its job may be stored.
func TestTriggerOutcomeUnknownIsSaid(t *testing.T) {
	t.Parallel()
	sub := protocol.OutcomeUnknown("submission", "j1", "no quorum")
	m, ok := triggerFailed("nightly", errors.New(sub.Message)).(settled)
	if !ok {
		t.Fatalf("%v, want a settled answer", m)
	}
	err := &client.ServerError{Message: m.Message.(*protocol.Error).Message}
	if !errors.Is(err, client.ErrOutcomeUnknown) || !strings.Contains(err.Message, "schedule nightly") ||
		!strings.Contains(err.Message, "submits another") || strings.Contains(err.Message, "not submitted") {
		t.Fatalf("%q: want Outcome unknown naming the schedule, and that sending again submits another job", err)
	}
	if e, ok := triggerFailed("nightly", errors.New("not serving")).(*protocol.Error); !ok || !strings.Contains(e.Message, "trigger not submitted") {
		t.Fatalf("%v: want trigger not submitted", e)
	}
}
