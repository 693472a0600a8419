package protocol_test

import (
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestReadOnly pins which client requests may be sent again when unanswered: those
// that change nothing. Every endpoint is listed, so a new one must be decided here.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	want := map[protocol.Type]bool{
		protocol.TypeSubmitJob:     false,
		protocol.TypeCancelJob:     false,
		protocol.TypeGetJobStatus:  true,
		protocol.TypeListJobs:      true,
		protocol.TypeListWorkers:   true,
		protocol.TypeListTaskTypes: true,
		// workflows: a submission names its workflow (sent again, the same one is
		// answered as the first); cancel and retry change state.
		protocol.TypeSubmitWorkflow: false,
		protocol.TypeGetWorkflow:    true,
		protocol.TypeCancelWorkflow: false,
		protocol.TypeRetryWorkflow:  false,
		// schedules: only the list changes nothing
		protocol.TypeAddSchedule:     false,
		protocol.TypeListSchedules:   true,
		protocol.TypePauseSchedule:   false,
		protocol.TypeResumeSchedule:  false,
		protocol.TypeRemoveSchedule:  false,
		protocol.TypeTriggerSchedule: false,
		protocol.TypeListQueues:      true,
		protocol.TypePauseQueue:      false,
		protocol.TypeResumeQueue:     false,
		protocol.TypeSetQueue:        false,
		protocol.TypeSetLimit:        false,
		protocol.TypeRemoveLimit:     false,
		protocol.TypeListLimits:      true,
		protocol.TypeSubmitJobs:      false,
	}
	if len(protocol.Endpoints) != len(want) {
		t.Fatalf("%d endpoints, %d decided here", len(protocol.Endpoints), len(want))
	}
	for _, e := range protocol.Endpoints {
		ro, decided := want[e.Request]
		if !decided {
			t.Fatalf("endpoint %s (%s) not decided here", e.Name, e.Request)
		}
		if got := protocol.ReadOnly(e.Request); got != ro {
			t.Errorf("ReadOnly(%s) = %v, want %v", e.Request, got, ro)
		}
		if got := protocol.ReadOnlySubject(e.Subject()); got != ro {
			t.Errorf("ReadOnlySubject(%s) = %v, want %v", e.Subject(), got, ro)
		}
	}
	for _, s := range []string{"", "jobbus.api", "jobbus.api.status.x", "jobbus.api.submit"} {
		if protocol.ReadOnlySubject(s) {
			t.Errorf("ReadOnlySubject(%q) = true", s)
		}
	}
	for _, typ := range protocol.KnownTypes() {
		if _, isRequest := protocol.EndpointFor(typ); !isRequest && protocol.ReadOnly(typ) {
			t.Errorf("ReadOnly(%s), which is no client request", typ)
		}
	}
}
