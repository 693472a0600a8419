package protocol_test

import (
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestOutcomeUnknownTexts: an "Outcome unknown" ERROR says what may be stored, why it
// is not known, and what to do instead of resubmitting; it names its job when it knows
// one, and the name reads back.
func TestOutcomeUnknownTexts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  *protocol.Error
		want string
		job  string
	}{
		{protocol.OutcomeUnknown("submission", "9f1c", "its write was not confirmed within 4s"),
			"Outcome unknown: job 9f1c: the submission may or may not be stored (its write was not confirmed within 4s); " +
				"do not submit it again as a new job: ask for the job's status, or submit again with the same idempotency key", "9f1c"},
		{protocol.OutcomeUnknown("cancel", "9f1c", "the coordinator stopped"),
			"Outcome unknown: job 9f1c: the cancel may or may not be stored (the coordinator stopped); " +
				"ask for the job's status, or send it again (a repeat changes nothing more)", "9f1c"},
		{protocol.OutcomeUnknownUnanswered("submission", "no reply from the coordinator within 5s"),
			"Outcome unknown: the submission may or may not be stored (no reply from the coordinator within 5s); do not submit it again", ""},
	} {
		if !strings.HasPrefix(tc.err.Message, tc.want) {
			t.Errorf("%q\nwant %q", tc.err.Message, tc.want)
		}
		job, ok := protocol.OutcomeUnknownJob(tc.err.Message)
		if job != tc.job || ok != (tc.job != "") {
			t.Errorf("OutcomeUnknownJob(%q) = %q, %v; want %q", tc.err.Message, job, ok, tc.job)
		}
	}
	if _, ok := protocol.OutcomeUnknownJob("Unknown job: 9f1c"); ok {
		t.Error("OutcomeUnknownJob took another ERROR for an Outcome unknown")
	}
}
