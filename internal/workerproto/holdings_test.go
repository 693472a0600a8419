package workerproto_test

import (
	"slices"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/workerproto"
)

// TestHoldingsReport: a report holds what was added and not removed, sorted by job,
// and carries the mark received before the last one, so that a mark is reported only
// once a later answer has arrived.
func TestHoldingsReport(t *testing.T) {
	t.Parallel()
	a := protocol.AttemptRef{JobID: "job-a", AttemptID: "1"}
	b := protocol.AttemptRef{JobID: "job-b", AttemptID: "2"}
	m1 := &protocol.Mark{Session: "s", Seq: 1}
	m2 := &protocol.Mark{Session: "s", Seq: 2}
	h := workerproto.NewHoldings()
	steps := []struct {
		name     string
		do       func()
		mark     protocol.Mark
		attempts []protocol.HeldAttempt
	}{
		{"Empty", func() {}, protocol.Mark{}, []protocol.HeldAttempt{}},
		{"AddedAndMarked", func() {
			if !h.Add(b) || !h.Add(a) || h.Add(a) {
				t.Error("Add reports a new attempt true, a held one false")
			}
			h.Marked(m1)
		}, protocol.Mark{}, []protocol.HeldAttempt{{AttemptRef: a}, {AttemptRef: b}}}, // m1 is the last: not yet
		{"ReportsDoNotRipen", func() { h.Report() }, protocol.Mark{}, []protocol.HeldAttempt{{AttemptRef: a}, {AttemptRef: b}}},
		{"MarkRipened", func() { h.Marked(m2) }, *m1, []protocol.HeldAttempt{{AttemptRef: a}, {AttemptRef: b}}},
		{"Finished", func() { h.Finished(b); h.Finished(protocol.AttemptRef{JobID: "not-held"}) }, *m1, []protocol.HeldAttempt{{AttemptRef: a}, {AttemptRef: b, Done: true}}},
		{"NilMarkChangesNothing", func() { h.Marked(nil); h.Remove(b) }, *m1, []protocol.HeldAttempt{{AttemptRef: a}}},
		{"NextMarkRipens", func() { h.Marked(m2) }, *m2, []protocol.HeldAttempt{{AttemptRef: a}}},
		{"ResetForgetsMarks", func() { h.Reset() }, protocol.Mark{}, []protocol.HeldAttempt{{AttemptRef: a}}},
	}
	for _, s := range steps {
		s.do()
		r := h.Report()
		if r.Mark != s.mark || !slices.Equal(r.Attempts, s.attempts) {
			t.Errorf("%s: report %+v, want mark %+v attempts %+v", s.name, *r, s.mark, s.attempts)
		}
	}
}
