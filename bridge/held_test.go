package bridge_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
)

// heartbeatSubject is where worker tcp-held's heartbeats reach any coordinator (bus's
// role subject, naming the sender); a plain subscription sees a copy of each.
const heartbeatSubject = "jobbus.role.coordinator.worker.tcp-held." + protocol.PathHeartbeat

// TestBridgeReportsWhatTCPWorkersHold: the bridge's heartbeats for a TCP worker carry
// the attempts it forwarded to it, from the TASK_ASSIGN until the result is delivered
// or the TASK_CANCEL forwarded, so the coordinator can find assignments and cancels
// lost while the bridge's own NATS connection was down (bus/protocol/held.go). The
// worker's frames stay the spec's.
func TestBridgeReportsWhatTCPWorkersHold(t *testing.T) {
	t.Parallel()
	s := setup(t)
	beats := make(chan *nats.Msg, 256)
	sub, err := s.NC.ChanSubscribe(heartbeatSubject, beats)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := s.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	w := s.worker("tcp-held", 2) // checks WORKER_REGISTERED byte for byte
	// reported beats until one from tcp-held whose attempts satisfy ok.
	reported := func(what string, ok func([]protocol.HeldAttempt) bool) {
		t.Helper()
		deadline := time.After(waitFor)
		tick := time.NewTicker(20 * time.Millisecond) // a beat while one is in flight adds none
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				w.MustSend(&protocol.Heartbeat{WorkerID: "tcp-held"})
			case m := <-beats:
				var hb protocol.Heartbeat
				if err := json.Unmarshal(m.Data, &hb); err != nil {
					t.Fatalf("heartbeat %s: %v", m.Data, err)
				}
				if hb.WorkerID == "tcp-held" && hb.Held != nil && ok(hb.Held.Attempts) {
					return
				}
			case <-deadline:
				t.Fatalf("no heartbeat reporting %s", what)
			}
		}
	}

	cancelled, err := s.native.Submit(context.Background(), "SLEEP", json.RawMessage(`{"durationMillis":600000}`))
	if err != nil {
		t.Fatal(err)
	}
	a := w.ExpectAssign(cancelled)
	held := protocol.AttemptRef{JobID: a.JobID, AttemptID: a.AttemptID}
	reported("the forwarded assignment", func(as []protocol.HeldAttempt) bool {
		return slices.Equal(as, []protocol.HeldAttempt{{AttemptRef: held}})
	})

	if _, _, err := s.native.Cancel(context.Background(), cancelled); err != nil {
		t.Fatal(err)
	}
	if c, ok := w.MustRecv().(*protocol.TaskCancel); !ok || c.AttemptID != a.AttemptID {
		t.Fatalf("got %+v, want the TASK_CANCEL of %s", c, a.AttemptID)
	}
	reported("nothing once the cancel is forwarded", func(as []protocol.HeldAttempt) bool { return len(as) == 0 })

	done, err := s.native.Submit(context.Background(), "SHA256", json.RawMessage(`{"text":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	// A heartbeat on its way while the cancel was forwarded still reported the
	// attempt: the coordinator cancels it again, which the worker ignores.
	var b *protocol.TaskAssign
	for b == nil {
		switch m := w.MustRecv().(type) {
		case *protocol.TaskCancel:
			if m.AttemptID != a.AttemptID {
				t.Fatalf("cancel of %s, want only %s's", m.AttemptID, a.AttemptID)
			}
		case *protocol.TaskAssign:
			if m.JobID != done {
				t.Fatalf("assignment %+v, want job %s", m, done)
			}
			b = m
		default:
			t.Fatalf("got %T %+v", m, m)
		}
	}
	ok := "done"
	w.MustSend(&protocol.TaskResult{WorkerID: "tcp-held", JobID: b.JobID, AttemptID: b.AttemptID, Success: true, Result: &ok})
	s.waitState(done, protocol.StateCompleted)
	reported("nothing once the result is delivered", func(as []protocol.HeldAttempt) bool { return len(as) == 0 })
}
