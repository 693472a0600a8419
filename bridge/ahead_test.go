package bridge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus/protocol"
)

// submitFrame is a framed SUBMIT_JOB of SHA256 with idempotency key name ("": none).
func submitFrame(t *testing.T, name, text string) []byte {
	t.Helper()
	payload, err := json.Marshal(map[string]string{"text": text})
	if err != nil {
		t.Fatal(err)
	}
	sj := &protocol.SubmitJob{TaskType: "SHA256", Payload: payload}
	if name != "" {
		sj.IdempotencyKey = &name
	}
	body, err := protocol.Encode(sj)
	if err != nil {
		t.Fatal(err)
	}
	return framed(string(body))
}

// submitFrames is n SHA256 submissions of text, framed one after the other, the
// idempotency key of the i-th "text i".
func submitFrames(t *testing.T, text string, n int) []byte {
	t.Helper()
	var frames []byte
	for i := range n {
		frames = append(frames, submitFrame(t, fmt.Sprintf("%s %d", text, i), text)...)
	}
	return frames
}

var (
	submitSubject, _     = protocol.SubjectFor(protocol.TypeSubmitJob)
	submitManySubject, _ = protocol.SubjectFor(protocol.TypeSubmitJobs)
)

// requestsServed is how many requests the coordinator's API served, by subject.
func (s *system) requestsServed() map[string]int {
	s.t.Helper()
	subject, err := micro.ControlSubject(micro.StatsVerb, protocol.ServiceName, "")
	if err != nil {
		s.t.Fatal(err)
	}
	m, err := s.NC.Request(subject, nil, waitFor)
	if err != nil {
		s.t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(m.Data, &stats); err != nil {
		s.t.Fatal(err)
	}
	served := map[string]int{}
	for _, e := range stats.Endpoints {
		served[e.Subject] += e.NumRequests
	}
	return served
}

// keyed is the job stored under idempotency key name for text: the one a duplicate
// names.
func (s *system) keyed(name, text string) string {
	s.t.Helper()
	id, err := s.native.Submit(context.Background(), "SHA256", map[string]string{"text": text}, func(sj *protocol.SubmitJob) { sj.IdempotencyKey = &name })
	if err != nil {
		s.t.Fatal(err)
	}
	return id
}

// TestClientPortPipelining sends many requests in one write, as a client sharing its
// connection among callers does: each reply comes in the order of its request, whatever
// the order the coordinator answers them in.
func TestClientPortPipelining(t *testing.T) {
	t.Parallel()

	t.Run("RepliesInRequestOrder", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		c := s.client()
		// Submissions (sent ahead), with requests served in line between them: an
		// unknown job's status (ERROR), the worker list, a submission the coordinator
		// refuses (ERROR, the connection stays) and a submission too large to go ahead.
		type want struct {
			name, text string // a submission's key and text, "" for the others
			kind       protocol.Type
			raw        []byte // the reply's bytes, where given
		}
		var batch []byte
		var wants []want
		big := strings.Repeat("x", 20<<10)
		for i := range 60 {
			switch i {
			case 10:
				batch = append(batch, framed(`{"type":"GET_JOB_STATUS","jobId":"nope"}`)...)
				wants = append(wants, want{kind: protocol.TypeError})
			case 20:
				batch = append(batch, framed(`{"type":"LIST_WORKERS"}`)...)
				wants = append(wants, want{kind: protocol.TypeWorkerList})
			case 30:
				// In a batch with the submissions around it: its answer must be the one it
				// gets alone, byte for byte.
				refused := `{"type":"SUBMIT_JOB","taskType":"SLEEP","payload":{"durationMillis":-1},"maxAttempts":1}`
				alone, err := s.native.DoRaw(context.Background(), protocol.TypeSubmitJob, []byte(refused))
				if err != nil {
					t.Fatal(err)
				}
				batch = append(batch, framed(refused)...)
				wants = append(wants, want{kind: protocol.TypeError, raw: alone})
			case 40:
				batch = append(batch, submitFrame(t, "big", big)...)
				wants = append(wants, want{name: "big", text: big, kind: protocol.TypeJobSubmitted})
			}
			name := fmt.Sprintf("job %d", i)
			batch = append(batch, submitFrame(t, name, name)...)
			wants = append(wants, want{name: name, text: name, kind: protocol.TypeJobSubmitted})
		}
		if err := c.Write(batch); err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for i, w := range wants {
			raw, err := c.RecvRaw()
			if err != nil {
				t.Fatalf("reply %d: %v", i, err)
			}
			if w.raw != nil && !bytes.Equal(raw, w.raw) {
				t.Fatalf("reply %d is\n%s\nalone it is\n%s", i, raw, w.raw)
			}
			m, err := protocol.Decode(raw)
			if err != nil {
				t.Fatalf("reply %d %s: %v", i, raw, err)
			}
			if m.MessageType() != w.kind {
				t.Fatalf("reply %d is %s %+v, want %s", i, m.MessageType(), m, w.kind)
			}
			js, ok := m.(*protocol.JobSubmitted)
			if !ok {
				continue
			}
			if want := s.keyed(w.name, w.text); js.JobID != want {
				t.Fatalf("reply %d names job %s; the job of its request (key %q) is %s", i, js.JobID, w.name, want)
			}
			ids[js.JobID] = true
		}
		if len(ids) != 61 {
			t.Fatalf("%d distinct jobs, want 61", len(ids))
		}
		// Still open, and in line again.
		if _, ok := c.Request(&protocol.ListWorkers{}).(*protocol.WorkerList); !ok {
			t.Fatal("connection not usable after the pipeline")
		}
	})

	for _, tc := range []struct {
		name, bad, errPrefix string
	}{
		{"MalformedFrameEndsIt", string(framed(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},"maxAttempts":"three"}`)), "Malformed request: "},
		{"BadLengthEndsIt", string(header(0)), "Malformed request: frame: length must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t)
			c := s.client()
			batch := submitFrames(t, "before", 5)
			batch = append(batch, tc.bad...)
			batch = append(batch, submitFrames(t, "after", 5)...)
			if err := c.Write(batch); err != nil {
				t.Fatal(err)
			}
			frames := c.ExpectClosed()
			if len(frames) != 6 {
				t.Fatalf("%d frames before the close, want 5 JOB_SUBMITTED and an ERROR: %q", len(frames), frames)
			}
			for i, f := range frames[:5] {
				m, err := protocol.Decode(f)
				js, ok := m.(*protocol.JobSubmitted)
				if err != nil || !ok {
					t.Fatalf("frame %d: %s, want JOB_SUBMITTED", i, f)
				}
				if want := s.keyed(fmt.Sprintf("before %d", i), "before"); js.JobID != want {
					t.Fatalf("frame %d names job %s, want %s", i, js.JobID, want)
				}
			}
			if !bytes.HasPrefix(frames[5], []byte(`{"type":"ERROR","message":"`+tc.errPrefix)) {
				t.Fatalf("last frame %s, want an ERROR %q...", frames[5], tc.errPrefix)
			}
			// The connection closed only once every request forwarded was answered, so a
			// submission behind the bad frame would be stored by now.
			page, err := s.native.List(context.Background(), protocol.ListJobs{})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Jobs) != 5 {
				t.Fatalf("%d jobs stored, want the 5 before the bad frame", len(page.Jobs))
			}
		})
	}

	t.Run("SentTogetherGoAsOneRequest", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		before := s.requestsServed()
		c := s.client()
		if err := c.Write(submitFrames(t, "together", 40)); err != nil {
			t.Fatal(err)
		}
		ids := make([]string, 40)
		for i := range ids {
			js, ok := c.MustRecv().(*protocol.JobSubmitted)
			if !ok {
				t.Fatalf("reply %d is no JOB_SUBMITTED", i)
			}
			ids[i] = js.JobID
		}
		after := s.requestsServed()
		singles := after[submitSubject] - before[submitSubject]
		batches := after[submitManySubject] - before[submitManySubject]
		if batches == 0 || singles+batches >= 40 {
			t.Fatalf("40 submissions sent together cost %d single and %d batch requests; want batches", singles, batches)
		}
		for i, id := range ids {
			if want := s.keyed(fmt.Sprintf("together %d", i), "together"); id != want {
				t.Fatalf("reply %d names job %s, want %s", i, id, want)
			}
		}
		t.Logf("40 submissions: %d batches, %d alone", batches, singles)
	})

	t.Run("ClosedBeforeReading", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		c := s.client()
		if err := c.Write(submitFrames(t, "gone", 20)); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		s.specWorker("w-1", 4)
		s.healthy(2) // the bridge serves on
	})
}

// TestClientPortBatchAnswers plays the coordinator on NATS to give a batch of
// submissions the answers a real one gives only across a failover or an outage, and
// checks what each submission's client then hears: what it would have heard alone.
func TestClientPortBatchAnswers(t *testing.T) {
	t.Parallel()
	errNotServing := `{"type":"ERROR","message":"` + protocol.NotServingPrefix + `: its lease lapsed"}`
	refusal := `{"type":"ERROR","message":"Malformed request: batch"}`
	for _, tc := range []struct {
		name string
		// answer answers the batch of request ids rids; "" sends no answer.
		answer func(rids []string) string
		// want checks the replies and the batches the bridge sent again meanwhile.
		want func(t *testing.T, rids []string, replies []protocol.Message, again []*nats.Msg)
	}{
		{
			name: "UnsettledIsSentAgain",
			answer: func(rids []string) string {
				return `{"type":"JOBS_SUBMITTED","answers":[{"type":"JOB_SUBMITTED","jobId":"` + protocol.RequestJobID(rids[0]) + `"},` + errNotServing + `]}`
			},
			want: func(t *testing.T, rids []string, replies []protocol.Message, again []*nats.Msg) {
				for i, m := range replies {
					if js, ok := m.(*protocol.JobSubmitted); !ok || js.JobID != protocol.RequestJobID(rids[i]) {
						t.Fatalf("reply %d %+v, want the job of request id %s", i, m, rids[i])
					}
				}
				if len(again) != 1 || fmt.Sprint(batchIDs(t, again[0])) != fmt.Sprint(rids[1:]) {
					t.Fatalf("sent again: %v, want the second, under its request id %s", sentAgain(t, again), rids[1])
				}
			},
		},
		{
			name:   "UnansweredNamesEachJob",
			answer: func([]string) string { return "" },
			want: func(t *testing.T, rids []string, replies []protocol.Message, _ []*nats.Msg) {
				for i, m := range replies {
					e, ok := m.(*protocol.Error)
					if want := protocol.OutcomeUnknownPrefix + "job " + protocol.RequestJobID(rids[i]); !ok || !strings.HasPrefix(e.Message, want) {
						t.Fatalf("reply %d %+v, want an ERROR %q...", i, m, want)
					}
				}
			},
		},
		{
			name:   "RefusedWhole",
			answer: func([]string) string { return refusal },
			want: func(t *testing.T, _ []string, replies []protocol.Message, again []*nats.Msg) {
				for i, m := range replies {
					if e, ok := m.(*protocol.Error); !ok || e.Message != "Malformed request: batch" {
						t.Fatalf("reply %d %+v, want the batch's refusal", i, m)
					}
				}
				if len(again) != 0 {
					t.Fatalf("%d sent again after a refusal, want none", len(again))
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t, noCoordinator())
			batches, again := standInMany(t, s.NC, tc.answer)
			// Two submissions in one write are read together, and so batched; should
			// the bridge read them apart (each then goes alone), try again.
			for try := 0; ; try++ {
				c := s.client()
				if err := c.Write(append(submitFrame(t, "", "one"), submitFrame(t, "", "two")...)); err != nil {
					t.Fatal(err)
				}
				replies := []protocol.Message{c.MustRecv(), c.MustRecv()}
				_ = c.Close()
				var sent []*nats.Msg
				for len(again) > 0 {
					sent = append(sent, <-again)
				}
				select {
				case rids := <-batches:
					tc.want(t, rids, replies, sent)
					return
				default:
				}
				if try == 20 {
					t.Fatal("the bridge never batched two submissions written together")
				}
			}
		})
	}
}

// standInMany stands in for the coordinator on submit.many until the test ends: a
// batch hears answer(its request ids) ("" sends no answer), and its first send goes to
// batches; a batch of submissions sent before in another batch (the bridge's send
// again of those left open) hears each submission's job and goes to again.
func standInMany(t *testing.T, nc *nats.Conn, answer func(rids []string) string) (batches <-chan []string, again <-chan *nats.Msg) {
	t.Helper()
	first, more := make(chan []string, 16), make(chan *nats.Msg, 16)
	var mu sync.Mutex
	seen := map[string]bool{} // each batch's request ids, joined
	sub, err := nc.Subscribe(submitManySubject, func(m *nats.Msg) {
		rids := batchIDs(t, m)
		key := strings.Join(rids, " ")
		mu.Lock()
		resent, ok := seen[key], len(seen) > 0
		seen[key] = true
		mu.Unlock()
		if ok && !resent && !protocol.FirstTry(m.Header.Get(protocol.HeaderRequestTry)) {
			more <- m
			var answers []string
			for _, rid := range rids {
				answers = append(answers, `{"type":"JOB_SUBMITTED","jobId":"`+protocol.RequestJobID(rid)+`"}`)
			}
			_ = m.Respond([]byte(`{"type":"JOBS_SUBMITTED","answers":[` + strings.Join(answers, ",") + `]}`))
			return
		}
		if !resent {
			first <- rids
		}
		if a := answer(rids); a != "" {
			_ = m.Respond([]byte(a))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return first, more
}

// batchIDs returns the request ids of the submissions in a SUBMIT_JOBS.
func batchIDs(t *testing.T, m *nats.Msg) []string {
	got, err := protocol.Decode(m.Data)
	req, ok := got.(*protocol.SubmitJobs)
	if err != nil || !ok {
		t.Errorf("submit.many got %s: %v", m.Data, err)
		return nil
	}
	var rids []string
	for _, j := range req.Jobs {
		rids = append(rids, j.RequestID)
	}
	return rids
}

// sentAgain lists the request ids of each batch and its send number.
func sentAgain(t *testing.T, msgs []*nats.Msg) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, fmt.Sprint(batchIDs(t, m))+" try "+m.Header.Get(protocol.HeaderRequestTry))
	}
	return out
}

// TestClientPortClientBatchSettled: a client's own SUBMIT_JOBS is answered as the
// bridge's batches are: a submission whose answer leaves its outcome open is sent once
// more alone, under its request id and marked as a send again, and its answer takes
// the open one's place; one without a request id keeps its answer (sent again it
// would be a new job).
func TestClientPortClientBatchSettled(t *testing.T) {
	t.Parallel()
	s := setup(t, noCoordinator())
	notServing := `{"type":"ERROR","message":"` + protocol.NotServingPrefix + `: its lease lapsed"}`
	_, again := standInMany(t, s.NC, func([]string) string {
		return `{"type":"JOBS_SUBMITTED","answers":[{"type":"JOB_SUBMITTED","jobId":"` + protocol.RequestJobID("r0") + `"},` + notServing + `,` + notServing + `]}`
	})

	submit := json.RawMessage(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"}}`)
	c := s.client()
	if err := c.Send(&protocol.SubmitJobs{Jobs: []protocol.BatchedSubmission{
		{RequestID: "r0", Submit: submit}, {RequestID: "r1", Submit: submit}, {Submit: submit},
	}}); err != nil {
		t.Fatal(err)
	}
	got, ok := c.MustRecv().(*protocol.JobsSubmitted)
	if !ok || len(got.Answers) != 3 {
		t.Fatalf("reply %+v, want a JOBS_SUBMITTED of 3 answers", got)
	}
	for i, want := range []string{
		`{"type":"JOB_SUBMITTED","jobId":"` + protocol.RequestJobID("r0") + `"}`,
		`{"type":"JOB_SUBMITTED","jobId":"` + protocol.RequestJobID("r1") + `"}`,
		notServing,
	} {
		if string(got.Answers[i]) != want {
			t.Fatalf("answer %d %s, want %s", i, got.Answers[i], want)
		}
	}
	var sent []*nats.Msg
	for len(again) > 0 {
		sent = append(sent, <-again)
	}
	if len(sent) != 1 || fmt.Sprint(batchIDs(t, sent[0])) != "[r1]" {
		t.Fatalf("sent again: %v, want r1", sentAgain(t, sent))
	}
}
