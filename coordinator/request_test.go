package coordinator_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/testkit"
)

// sendSubmission sends a SUBMIT_JOB of payload as send try of request rid, the way the
// clients do (client/failover.go), and returns the reply.
func sendSubmission(t *testing.T, nc *nats.Conn, rid string, try int, payload string) protocol.Message {
	t.Helper()
	body, err := protocol.Encode(&protocol.SubmitJob{TaskType: "SHA256", Payload: []byte(payload)})
	must(t, err)
	e, _ := protocol.EndpointFor(protocol.TypeSubmitJob)
	m := nats.NewMsg(e.Subject())
	m.Data = body
	m.Header.Set(protocol.HeaderRequestID, rid)
	m.Header.Set(protocol.HeaderRequestTry, protocol.TryValue(try))
	reply, err := nc.RequestMsg(m, 10*time.Second)
	must(t, err)
	msg, err := protocol.Decode(reply.Data)
	must(t, err)
	return msg
}

// TestSubmissionSentAgain: a submission sent again under its request id is answered
// with the job the first send created, whether that job is still being stored, queued,
// finished (and out of memory), or was stored by the coordinator before a restart; the
// store holds that one job. The same request id with another submission is an ERROR.
func TestSubmissionSentAgain(t *testing.T) {
	t.Parallel()
	const payload, other = `{"text":"again"}`, `{"text":"other"}`
	cases := []struct {
		name    string
		worker  bool                // the job runs to the end before the send again
		between func(s *system)     // what happens between the two sends
		second  string              // the payload sent again
		want    func(id string) any // JOB_SUBMITTED with this id, or an ERROR containing this
	}{
		{name: "WhileQueued", second: payload},
		{name: "AfterItFinished", worker: true, second: payload},
		{name: "AfterARestart", between: func(s *system) { s.RestartCoordinator(s.T()) }, second: payload},
		{name: "FinishedBeforeARestart", worker: true, between: func(s *system) { s.RestartCoordinator(s.T()) }, second: payload},
		{name: "WithAnotherSubmission", second: other},
		{name: "WithAnotherSubmissionAfterItFinished", worker: true, second: other},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t, func(c *coordinator.Config) { c.Retention = time.Hour })
			if tc.worker {
				s.StartWorker(1)
			}
			rid := protocol.NewRequestID()
			first, ok := sendSubmission(t, s.NC, rid, 1, payload).(*protocol.JobSubmitted)
			if !ok || first.JobID != protocol.RequestJobID(rid) {
				t.Fatalf("first send: %+v, want JOB_SUBMITTED %s", first, protocol.RequestJobID(rid))
			}
			if tc.worker {
				if j := s.Wait(first.JobID); j.State != protocol.StateCompleted {
					t.Fatalf("job %+v, want COMPLETED", j)
				}
			}
			if tc.between != nil {
				tc.between(s)
			}
			again := sendSubmission(t, s.NC, rid, 2, tc.second)
			if tc.second == payload {
				if r, ok := again.(*protocol.JobSubmitted); !ok || r.JobID != first.JobID {
					t.Fatalf("sent again: %+v, want JOB_SUBMITTED %s", again, first.JobID)
				}
			} else if e, ok := again.(*protocol.Error); !ok || !strings.Contains(e.Message, "already used for a different submission (job "+first.JobID+")") {
				t.Fatalf("sent again with another submission: %+v, want the reuse ERROR", again)
			}
			if ids := storedJobs(t, s); len(ids) != 1 || ids[0] != first.JobID {
				t.Fatalf("the store holds %v, want only %s", ids, first.JobID)
			}
			if tc.worker {
				if j := s.Status(first.JobID); j.State != protocol.StateCompleted || j.Attempts != 1 {
					t.Fatalf("job %+v after the send again, want COMPLETED after 1 attempt", j)
				}
			}
		})
	}
}

// TestSubmissionSentManyTimesAtOnce: sends of one request that arrive together, as a
// client's after a slow answer, all get the one job.
func TestSubmissionSentManyTimesAtOnce(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.StartWorker(2)
	rid := protocol.NewRequestID()
	var wg sync.WaitGroup
	replies := make([]protocol.Message, 8)
	for i := range replies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = sendSubmission(t, s.NC, rid, i+1, `{"text":"burst"}`)
		}()
	}
	wg.Wait()
	for i, m := range replies {
		if r, ok := m.(*protocol.JobSubmitted); !ok || r.JobID != protocol.RequestJobID(rid) {
			t.Fatalf("send %d: %+v, want JOB_SUBMITTED %s", i+1, m, protocol.RequestJobID(rid))
		}
	}
	if ids := storedJobs(t, s); len(ids) != 1 {
		t.Fatalf("the store holds %v, want one job", ids)
	}
	if j := s.Wait(protocol.RequestJobID(rid)); j.State != protocol.StateCompleted || j.Attempts != 1 {
		t.Fatalf("job %+v, want COMPLETED after 1 attempt", j)
	}
}

func TestRequestIDBounds(t *testing.T) {
	t.Parallel()
	s := setup(t)
	long := strings.Repeat("r", protocol.MaxRequestID+1)
	if e, ok := sendSubmission(t, s.NC, long, 1, `{"text":"x"}`).(*protocol.Error); !ok || !strings.Contains(e.Message, "Request id") {
		t.Fatalf("a %d-byte request id: %+v, want an ERROR", len(long), e)
	}
	if ids := storedJobs(t, s); len(ids) != 0 {
		t.Fatalf("the store holds %v, want nothing", ids)
	}
}

// TestClientSubmitsUnderARequestID: the Go client's submission creates the job its
// request id names, and one without a request id (a `nats req` by hand) still gets a
// random one.
func TestClientSubmitsUnderARequestID(t *testing.T) {
	t.Parallel()
	s := setup(t)
	e, _ := protocol.EndpointFor(protocol.TypeSubmitJob)
	var mu sync.Mutex
	var seen []string
	sub, err := s.NC.Subscribe(e.Subject(), func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, m.Header.Get(protocol.HeaderRequestID)+" "+m.Header.Get(protocol.HeaderRequestTry))
	})
	must(t, err)
	defer sub.Unsubscribe()
	id, err := client.New(s.NC).Submit(context.Background(), "SHA256", text("x"))
	must(t, err)
	// The reply can come before this subscription's handler has run for the send.
	testkit.Eventually(t, 5*time.Second, "the send overheard", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0
	})
	mu.Lock()
	if len(seen) != 1 || !strings.HasSuffix(seen[0], " ") || protocol.RequestJobID(strings.Fields(seen[0])[0]) != id {
		t.Fatalf("job %s from the sends %q: want one first send whose request id names it", id, seen)
	}
	mu.Unlock()

	reply, err := s.NC.Request(e.Subject(), []byte(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"y"}}`), 10*time.Second)
	must(t, err)
	m, err := protocol.Decode(reply.Data)
	must(t, err)
	if r, ok := m.(*protocol.JobSubmitted); !ok || r.JobID == id || len(r.JobID) != 36 || r.JobID[14] != '4' {
		t.Fatalf("submission without a request id: %+v, want a new random (version 4) job id", m)
	}
}
