package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestChildOfAParentNeverStored: a job submitted after a parent whose create is still in
// flight waits for it. When that create fails, the parent never existed: the child is
// cancelled, saying why, rather than left waiting (and, at the next recovery, released
// as if its parent had completed and expired).
func TestChildOfAParentNeverStored(t *testing.T) {
	s, st, parent := startHeld(t, true, sha("parent"))
	child := sha("child")
	child.After = []string{st.id}
	answer := make(chan protocol.Message, 1)
	s.sched.submit(child, request{due: s.sched.cfg.ReplyWithin}, func(m protocol.Message) { answer <- answerOf(m) })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		s.sched.mu.Lock()
		waiting := len(s.sched.deps.pending)
		s.sched.mu.Unlock()
		if waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child never waited for its parent")
		}
	}
	close(st.release)
	for _, ch := range []<-chan protocol.Message{parent, answer} {
		select {
		case m := <-ch:
			if _, ok := m.(*protocol.JobSubmitted); ok == (ch == parent) {
				t.Fatalf("answered %#v", m)
			}
			if ch == answer {
				child := s.status(m.(*protocol.JobSubmitted).JobID)
				if child.State != protocol.StateCancelled || child.Error == nil || !strings.Contains(*child.Error, st.id+" was not stored") {
					t.Fatalf("child %s %v, want CANCELLED: its parent %s was not stored", child.State, child.Error, st.id)
				}
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no answer to a submission")
		}
	}
	s.quiet() // neither runs
}
