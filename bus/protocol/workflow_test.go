package protocol_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// The workflow messages (native extensions) in the protocol's table tests.
func init() {
	roundTripCases = append(roundTripCases, []struct {
		name string
		msg  protocol.Message
	}{
		{"SubmitWorkflow", &protocol.SubmitWorkflow{WorkflowID: "wf", Steps: []protocol.WorkflowStep{
			{Name: "a", TaskType: "SHA256", Payload: json.RawMessage(`{"text":"a"}`)},
			{Name: "b", TaskType: "SLEEP", Payload: json.RawMessage(`{"durationMillis":1}`), MaxAttempts: 2, Priority: ptr(protocol.PriorityHigh), After: []string{"a"}, AfterAnyEnd: true},
		}, Edges: [][2]string{{"a", "b"}}, Chain: []string{"a", "b"}}},
		{"SubmitBatch", &protocol.SubmitWorkflow{Kind: protocol.KindBatch, Steps: []protocol.WorkflowStep{{Name: "x", TaskType: "SHA256", Payload: json.RawMessage(`{}`)}},
			OnSuccess: &protocol.WorkflowStep{TaskType: "SHA256", Payload: json.RawMessage(`{}`)}, OnComplete: &protocol.WorkflowStep{TaskType: "SHA256", Payload: json.RawMessage(`{}`)}}},
		{"WorkflowSubmitted", &protocol.WorkflowSubmitted{WorkflowID: "wf", Jobs: map[string]string{"a": "j1"}}},
		{"GetWorkflow", &protocol.GetWorkflow{WorkflowID: "wf"}},
		{"WorkflowStatus", &protocol.WorkflowStatus{WorkflowID: "wf", Kind: protocol.KindWorkflow, State: "RUNNING", CreatedAtMillis: 1,
			Counts: map[protocol.State]int{protocol.StateWaiting: 1}, Steps: []protocol.StepStatus{{Name: "a", JobID: "j", State: protocol.StateWaiting, After: []string{"b"}, Error: ptr("e")}}, Truncated: true}},
		{"CancelWorkflow", &protocol.CancelWorkflow{WorkflowID: "wf"}},
		{"WorkflowCancelled", &protocol.WorkflowCancelled{WorkflowID: "wf", Cancelled: 3}},
		{"RetryWorkflow", &protocol.RetryWorkflow{WorkflowID: "wf"}},
		{"WorkflowRetried", &protocol.WorkflowRetried{WorkflowID: "wf", Jobs: map[string]string{"b": "j2"}}},
	}...)
	specFields[protocol.TypeSubmitWorkflow] = []string{"steps"}
	specFields[protocol.TypeWorkflowSubmitted] = []string{"workflowId", "jobs"}
	specFields[protocol.TypeGetWorkflow] = []string{"workflowId"}
	specFields[protocol.TypeWorkflowStatus] = []string{"workflowId", "kind", "state", "createdAtMillis", "counts", "steps"}
	specFields[protocol.TypeCancelWorkflow] = []string{"workflowId"}
	specFields[protocol.TypeWorkflowCancelled] = []string{"workflowId", "cancelled"}
	specFields[protocol.TypeRetryWorkflow] = []string{"workflowId"}
	specFields[protocol.TypeWorkflowRetried] = []string{"workflowId", "jobs"}
}

func TestWorkflowEndpointSubjects(t *testing.T) {
	t.Parallel()
	want := map[protocol.Type]string{
		protocol.TypeSubmitWorkflow: "jobbus.api.workflow.submit",
		protocol.TypeGetWorkflow:    "jobbus.api.workflow.status",
		protocol.TypeCancelWorkflow: "jobbus.api.workflow.cancel",
		protocol.TypeRetryWorkflow:  "jobbus.api.workflow.retry",
	}
	for typ, subject := range want {
		e, ok := protocol.EndpointFor(typ)
		if !ok || e.Subject() != subject || strings.Contains(e.Name, ".") {
			t.Errorf("%s: endpoint %+v subject %s, want %s (a name without dots)", typ, e, e.Subject(), subject)
		}
	}
}

func TestValidStepName(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{"a": true, "fetch-1_b": true, "": false, "a b": false, "a.b": false, strings.Repeat("x", 65): false, strings.Repeat("x", 64): true} {
		if err := protocol.ValidStepName(name); (err == nil) != ok {
			t.Errorf("ValidStepName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}
