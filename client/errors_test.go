package client_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

func TestServerErrorKinds(t *testing.T) {
	t.Parallel()
	cases := []struct {
		msg            string
		noCoordinator  bool
		outcomeUnknown bool
		job            string // the job an "Outcome unknown" names
	}{
		{msg: protocol.CoordinatorUnavailable("no reply within 5s").Message, noCoordinator: true},
		{msg: "Unknown job: x"},
		{msg: "Invalid payload: Payload must be a JSON object"},
		{msg: "job not stored: the job store is full (JetStream: insufficient resources)"},
		{msg: protocol.OutcomeUnknown("submission", "j-1", "its write was not confirmed within 4s").Message, outcomeUnknown: true, job: "j-1"},
		{msg: protocol.OutcomeUnknown("cancel", "j-2", "stream KV_JOBS has lost its quorum").Message, outcomeUnknown: true, job: "j-2"},
		{msg: protocol.OutcomeUnknownUnanswered("submission", "no reply from the coordinator within 5s").Message, outcomeUnknown: true},
	}
	for _, tc := range cases {
		err := fmt.Errorf("submit: %w", &client.ServerError{Message: tc.msg})
		if !errors.Is(err, client.ErrServer) {
			t.Errorf("%q: not ErrServer", tc.msg)
		}
		if errors.Is(err, client.ErrNoCoordinator) != tc.noCoordinator {
			t.Errorf("%q: errors.Is(ErrNoCoordinator) = %v, want %v", tc.msg, !tc.noCoordinator, tc.noCoordinator)
		}
		if errors.Is(err, client.ErrOutcomeUnknown) != tc.outcomeUnknown {
			t.Errorf("%q: errors.Is(ErrOutcomeUnknown) = %v, want %v", tc.msg, !tc.outcomeUnknown, tc.outcomeUnknown)
		}
		if job, ok := client.OutcomeJob(err); job != tc.job || ok != (tc.job != "") {
			t.Errorf("%q: OutcomeJob = %q, %v; want %q", tc.msg, job, ok, tc.job)
		}
	}
}
