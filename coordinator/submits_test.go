package coordinator_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/coordinator"
)

// submitBody is the SUBMIT_JOB of SHA256 over text as a client encodes it, changed by mods.
func submitBody(t *testing.T, text string, mods ...func(*protocol.SubmitJob)) json.RawMessage {
	t.Helper()
	m := &protocol.SubmitJob{TaskType: "SHA256", Payload: json.RawMessage(fmt.Sprintf(`{"text":%q}`, text))}
	for _, mod := range mods {
		mod(m)
	}
	body, err := protocol.Encode(m)
	must(t, err)
	return body
}

// ask sends body to the API endpoint of request type want as send try of request rid
// ("": no request id), as the clients do, and returns the reply.
func ask(t *testing.T, nc *nats.Conn, want protocol.Type, rid string, try int, body []byte) *nats.Msg {
	t.Helper()
	e, _ := protocol.EndpointFor(want)
	m := nats.NewMsg(e.Subject())
	m.Data = body
	if rid != "" {
		m.Header.Set(protocol.HeaderRequestID, rid)
	}
	m.Header.Set(protocol.HeaderRequestTry, protocol.TryValue(try))
	reply, err := nc.RequestMsg(m, 20*time.Second)
	must(t, err)
	return reply
}

// sendBatch sends a SUBMIT_JOBS of jobs as send try of the batch and returns the reply.
func sendBatch(t *testing.T, nc *nats.Conn, try int, jobs []protocol.BatchedSubmission) *nats.Msg {
	t.Helper()
	body, err := protocol.Encode(&protocol.SubmitJobs{Jobs: jobs})
	must(t, err)
	return ask(t, nc, protocol.TypeSubmitJobs, "", try, body)
}

// answersOf is the answers of a JOBS_SUBMITTED reply, one per submission sent.
func answersOf(t *testing.T, reply *nats.Msg, sent int) []json.RawMessage {
	t.Helper()
	m, err := protocol.Decode(reply.Data)
	must(t, err)
	r, ok := m.(*protocol.JobsSubmitted)
	if !ok || len(r.Answers) != sent || reply.Header.Get(micro.ErrorCodeHeader) != "" {
		t.Fatalf("reply %s (headers %v), want JOBS_SUBMITTED with %d answers and no error headers", reply.Data, reply.Header, sent)
	}
	return r.Answers
}

// submittedBytes is the JOB_SUBMITTED of job id, as the coordinator encodes it.
func submittedBytes(t *testing.T, id string) string {
	t.Helper()
	b, err := protocol.Encode(&protocol.JobSubmitted{JobID: id})
	must(t, err)
	return string(b)
}

// TestSubmitJobsCreatesEachJob: every submission of a batch creates its job, in the
// batch's order: the one its request id names (a random one without), answered with
// the JOB_SUBMITTED it would have got alone; each runs.
func TestSubmitJobsCreatesEachJob(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.StartWorker(2)
	rids := []string{protocol.NewRequestID(), protocol.NewRequestID(), "", protocol.NewRequestID(), protocol.NewRequestID()}
	jobs := make([]protocol.BatchedSubmission, len(rids))
	for i, rid := range rids {
		jobs[i] = protocol.BatchedSubmission{RequestID: rid, Submit: submitBody(t, fmt.Sprint("job ", i))}
	}
	answers := answersOf(t, sendBatch(t, s.NC, 1, jobs), len(jobs))
	ids := make(map[string]bool)
	for i, rid := range rids {
		m, err := protocol.Decode(answers[i])
		must(t, err)
		got, ok := m.(*protocol.JobSubmitted)
		switch {
		case !ok:
			t.Fatalf("answer %d: %s, want JOB_SUBMITTED", i, answers[i])
		case rid != "" && got.JobID != protocol.RequestJobID(rid):
			t.Fatalf("answer %d: job %s, want %s, the job of request %s", i, got.JobID, protocol.RequestJobID(rid), rid)
		case string(answers[i]) != submittedBytes(t, got.JobID):
			t.Fatalf("answer %d: %s, want %s", i, answers[i], submittedBytes(t, got.JobID))
		}
		j := s.Wait(got.JobID)
		if j.State != protocol.StateCompleted || j.TaskType != "SHA256" {
			t.Fatalf("job %d: %+v, want a COMPLETED SHA256", i, j)
		}
		ids[got.JobID] = true
	}
	if stored := storedJobs(t, s); len(ids) != len(jobs) || len(stored) != len(jobs) {
		t.Fatalf("answered jobs %v, the store holds %v; want %d of each", ids, stored, len(jobs))
	}
}

// TestSubmitJobsAnswersEachAsAlone: each submission of a batch gets exactly the bytes
// it gets sent alone on jobbus.api.submit, whatever its outcome, in its own slot: the
// others are served all the same.
func TestSubmitJobsAnswersEachAsAlone(t *testing.T) {
	t.Parallel()
	s := setup(t, func(c *coordinator.Config) { c.MaxActiveJobs = 2 }) // no worker: jobs stay active
	key := func(k string) func(*protocol.SubmitJob) { return func(m *protocol.SubmitJob) { m.IdempotencyKey = &k } }
	first, ok := mustDecode(t, ask(t, s.NC, protocol.TypeSubmitJob, "", 1, submitBody(t, "keyed", key("k"))).Data).(*protocol.JobSubmitted)
	if !ok {
		t.Fatal("the keyed job was not submitted")
	}
	admitted := protocol.NewRequestID()
	items := []struct {
		name string
		job  protocol.BatchedSubmission
		want string // what the answer starts with (each is compared to the single's too)
	}{
		{"Admitted", protocol.BatchedSubmission{RequestID: admitted, Submit: submitBody(t, "admitted")}, submittedBytes(t, protocol.RequestJobID(admitted))},
		{"UnknownTaskType", protocol.BatchedSubmission{Submit: submitBody(t, "x", func(m *protocol.SubmitJob) { m.TaskType = "NO_SUCH_TASK" })}, `{"type":"ERROR"`},
		{"Malformed", protocol.BatchedSubmission{Submit: json.RawMessage(`{"type":"SUBMIT_JOB","taskType":5,"payload":{}}`)}, `{"type":"ERROR","message":"Malformed request: `},
		{"NoSubmission", protocol.BatchedSubmission{RequestID: protocol.NewRequestID()}, `{"type":"ERROR","message":"Malformed request: `},
		{"NotASubmission", protocol.BatchedSubmission{Submit: json.RawMessage(`{"type":"GET_JOB_STATUS","jobId":"x"}`)}, `{"type":"ERROR","message":"Unexpected message type GET_JOB_STATUS on jobbus.api.submit"`},
		{"KeyDuplicate", protocol.BatchedSubmission{RequestID: protocol.NewRequestID(), Submit: submitBody(t, "keyed", key("k"))}, submittedBytes(t, first.JobID)},
		{"KeyConflict", protocol.BatchedSubmission{Submit: submitBody(t, "other", key("k"))}, `{"type":"ERROR","message":"Idempotency key 'k'`},
		{"AtCapacity", protocol.BatchedSubmission{RequestID: protocol.NewRequestID(), Submit: submitBody(t, "one too many")}, `{"type":"SUBMIT_REJECTED"`},
		{"BadRequestID", protocol.BatchedSubmission{RequestID: strings.Repeat("r", protocol.MaxRequestID+1), Submit: submitBody(t, "x")}, `{"type":"ERROR","message":"Request id`},
	}
	jobs := make([]protocol.BatchedSubmission, len(items))
	for i, it := range items {
		jobs[i] = it.job
	}
	answers := answersOf(t, sendBatch(t, s.NC, 1, jobs), len(jobs))
	for i, it := range items {
		t.Run(it.name, func(t *testing.T) {
			if !strings.HasPrefix(string(answers[i]), it.want) {
				t.Fatalf("answer %s, want %s...", answers[i], it.want)
			}
			body := it.job.Submit
			if body == nil {
				body = json.RawMessage("null") // what the batch carried
			}
			// Alone now, the same submission meets what it met in the batch: its
			// request's job, the key bound, the active limit reached.
			alone := ask(t, s.NC, protocol.TypeSubmitJob, it.job.RequestID, 1, body)
			if string(answers[i]) != string(alone.Data) {
				t.Fatalf("answer in the batch %s, alone %s", answers[i], alone.Data)
			}
		})
	}
	want := []string{first.JobID, protocol.RequestJobID(admitted)}
	if stored := storedJobs(t, s); !sameSet(stored, want) {
		t.Fatalf("the store holds %v, want %v", stored, want)
	}
}

// TestSubmitJobsSentAgain: a batch sent again (a later try, the same request ids)
// creates no job twice: each submission is answered with the job its first send
// created, wherever that job is by then.
func TestSubmitJobsSentAgain(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		worker  bool // the jobs run to the end before the send again
		restart bool // the coordinator restarts before the send again
	}{
		{name: "WhileQueued"},
		{name: "AfterTheyFinished", worker: true},
		{name: "AfterARestart", restart: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t, func(c *coordinator.Config) { c.Retention = time.Hour })
			if tc.worker {
				s.StartWorker(2)
			}
			jobs := make([]protocol.BatchedSubmission, 3)
			for i := range jobs {
				jobs[i] = protocol.BatchedSubmission{RequestID: protocol.NewRequestID(), Submit: submitBody(t, fmt.Sprint("again ", i))}
			}
			answers := answersOf(t, sendBatch(t, s.NC, 1, jobs), len(jobs))
			var ids []string
			for i, a := range answers {
				ids = append(ids, protocol.RequestJobID(jobs[i].RequestID))
				if string(a) != submittedBytes(t, ids[i]) {
					t.Fatalf("first send, answer %d: %s, want JOB_SUBMITTED %s", i, a, ids[i])
				}
				if tc.worker {
					if j := s.Wait(ids[i]); j.State != protocol.StateCompleted {
						t.Fatalf("job %+v, want COMPLETED", j)
					}
				}
			}
			if tc.restart {
				s.RestartCoordinator(t)
			}
			again := answersOf(t, sendBatch(t, s.NC, 2, jobs), len(jobs))
			for i := range again {
				if string(again[i]) != string(answers[i]) {
					t.Fatalf("sent again, answer %d: %s, want %s", i, again[i], answers[i])
				}
			}
			if stored := storedJobs(t, s); !sameSet(stored, ids) {
				t.Fatalf("the store holds %v, want %v", stored, ids)
			}
			for _, id := range ids {
				if j := s.Status(id); tc.worker && (j.State != protocol.StateCompleted || j.Attempts != 1) {
					t.Fatalf("job %+v after the send again, want COMPLETED after 1 attempt", j)
				}
			}
		})
	}
}

// TestSubmitJobsCarryTheBatchTrace: the batch request's trace context is each of its
// submissions' (they carry none of their own): every job's assignment hands it on.
func TestSubmitJobsCarryTheBatchTrace(t *testing.T) {
	t.Parallel()
	s := setup(t)
	m := s.ManualWorker("w", 2)
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	body, err := protocol.Encode(&protocol.SubmitJobs{Jobs: []protocol.BatchedSubmission{
		{RequestID: protocol.NewRequestID(), Submit: submitBody(t, "a")},
		{Submit: submitBody(t, "b")},
	}})
	must(t, err)
	e, _ := protocol.EndpointFor(protocol.TypeSubmitJobs)
	req := nats.NewMsg(e.Subject())
	req.Data = body
	req.Header.Set(protocol.HeaderTraceParent, parent)
	reply, err := s.NC.RequestMsg(req, 20*time.Second)
	must(t, err)
	answersOf(t, reply, 2)
	for range 2 {
		if a := s.NextAssign(m); a.TraceParent != parent {
			t.Fatalf("assignment of job %s: traceparent %q, want the batch's %q", a.JobID, a.TraceParent, parent)
		}
	}
}

// TestSubmitJobsRefusedWhole: a batch the coordinator cannot take as a batch (empty,
// over protocol.MaxSubmissions, malformed) gets one ERROR (400, with micro's headers)
// for all of it, and nothing of it is stored.
func TestSubmitJobsRefusedWhole(t *testing.T) {
	t.Parallel()
	s := setup(t)
	tooMany := make([]protocol.BatchedSubmission, protocol.MaxSubmissions+1)
	for i := range tooMany {
		tooMany[i] = protocol.BatchedSubmission{RequestID: protocol.NewRequestID(), Submit: submitBody(t, fmt.Sprint(i))}
	}
	over, err := protocol.Encode(&protocol.SubmitJobs{Jobs: tooMany})
	must(t, err)
	one := `{"requestId":"r1","submit":` + string(submitBody(t, "one")) + `}`
	cases := []struct {
		name, body, want string
	}{
		{"Empty", `{"type":"SUBMIT_JOBS","jobs":[]}`, protocol.NoSubmissions().Message},
		{"NoJobs", `{"type":"SUBMIT_JOBS"}`, protocol.NoSubmissions().Message},
		{"NullJobs", `{"type":"SUBMIT_JOBS","jobs":null}`, protocol.NoSubmissions().Message},
		{"OverTheLimit", string(over), protocol.TooManySubmissions(protocol.MaxSubmissions + 1).Message},
		{"Malformed", `{"type":"SUBMIT_JOBS","jobs":[` + one + `,`, "Malformed request: "},
		{"JobsNotAList", `{"type":"SUBMIT_JOBS","jobs":` + one + `}`, "Malformed request: "},
		{"NotABatch", string(submitBody(t, "alone")), "Unexpected message type SUBMIT_JOB on jobbus.api.submit.many"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reply := ask(t, s.NC, protocol.TypeSubmitJobs, "", 1, []byte(tc.body))
			e, ok := mustDecode(t, reply.Data).(*protocol.Error)
			if !ok || !strings.HasPrefix(e.Message, tc.want) {
				t.Fatalf("reply %s, want ERROR %q", reply.Data, tc.want)
			}
			if reply.Header.Get(micro.ErrorCodeHeader) != "400" || reply.Header.Get(micro.ErrorHeader) != e.Message {
				t.Fatalf("headers %v, want code 400 and the message", reply.Header)
			}
		})
	}
	if stored := storedJobs(t, s); len(stored) != 0 {
		t.Fatalf("the store holds %v, want nothing", stored)
	}
}

// TestSubmitJobsNotServing: a coordinator that is not serving (fenced, its API not yet
// withdrawn; its lease lapsed) refuses a batch whole with one 503, as it refuses a
// single submission, and stores none of it.
func TestSubmitJobsNotServing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		stop func(c *coordinator.Coordinator)
	}{
		{"Fenced", func(c *coordinator.Coordinator) {
			c.FenceLeavingTheAPIUp(fmt.Errorf("%w: term 1 ended", coordinator.ErrFenced))
		}},
		{"LeaseLapsed", func(c *coordinator.Coordinator) { c.RenewedLease(time.Now().Add(-time.Minute), time.Second) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t)
			tc.stop(s.Coordinator)
			jobs := []protocol.BatchedSubmission{
				{RequestID: protocol.NewRequestID(), Submit: submitBody(t, "a")},
				{Submit: submitBody(t, "b")},
			}
			reply := sendBatch(t, s.NC, 1, jobs)
			e, ok := mustDecode(t, reply.Data).(*protocol.Error)
			if !ok || !strings.HasPrefix(e.Message, coordinator.ErrNotServing.Error()) {
				t.Fatalf("reply %s, want one ERROR %q...", reply.Data, coordinator.ErrNotServing)
			}
			if reply.Header.Get(micro.ErrorCodeHeader) != "503" {
				t.Fatalf("headers %v, want code 503", reply.Header)
			}
			if stored := storedJobs(t, s); len(stored) != 0 {
				t.Fatalf("the store holds %v, want nothing", stored)
			}
		})
	}
}

func mustDecode(t *testing.T, data []byte) protocol.Message {
	t.Helper()
	m, err := protocol.Decode(data)
	must(t, err)
	return m
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := make(map[string]int)
	for _, s := range a {
		seen[s]++
	}
	for _, s := range b {
		if seen[s]--; seen[s] < 0 {
			return false
		}
	}
	return true
}
