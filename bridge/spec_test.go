package bridge_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// The tests here hold the TCP ports to statements of the spec (PROTOCOL.md) that the
// other tests do not reach, each over real sockets with spec peers on both ports.

// withClock gives the coordinator clk, and deadlines and heartbeat timeouts the clock
// never reaches while a test moves it.
func withClock(clk *jobbustest.Clock, f func(*coordinator.Config)) option {
	return withCoordinator(func(c *coordinator.Config) {
		c.Now = clk.Now
		c.HeartbeatTimeout = 24 * time.Hour
		c.TaskTimeout = 24 * time.Hour
		if f != nil {
			f(c)
		}
	})
}

// submitRaw sends one SUBMIT_JOB frame as written and returns the job it created.
func submitRaw(t *testing.T, c *peer, frame string) string {
	t.Helper()
	if err := c.SendPayload([]byte(frame)); err != nil {
		t.Fatal(err)
	}
	m := c.MustRecv()
	js, ok := m.(*protocol.JobSubmitted)
	if !ok {
		t.Fatalf("%s: got %T %+v, want JOB_SUBMITTED", frame, m, m)
	}
	return js.JobID
}

// finish reports attempt a of worker w a success.
func finish(w *peer, id string, a *protocol.TaskAssign) {
	w.MustSend(&protocol.TaskResult{WorkerID: id, JobID: a.JobID, AttemptID: a.AttemptID, Success: true, Result: ptr("ok")})
}

// nextAssign receives worker w's next frame, which must be a TASK_ASSIGN.
// finishInOrder completes the next n jobs assigned to w, the worker "w", and returns
// their ids in the order they came.
func finishInOrder(t *testing.T, w *peer, n int) []string {
	var order []string
	for range n {
		a := nextAssign(t, w)
		order = append(order, a.JobID)
		finish(w, "w", a)
	}
	return order
}

func nextAssign(t *testing.T, w *peer) *protocol.TaskAssign {
	t.Helper()
	m := w.MustRecv()
	a, ok := m.(*protocol.TaskAssign)
	if !ok {
		t.Fatalf("got %T %+v, want TASK_ASSIGN", m, m)
	}
	return a
}

// TestSpecRetryKeepsItsPlaceInTheQueue: PROTOCOL.md, "A retry keeps the job's original
// priority and submission sequence." A job that failed and comes back from RETRY_WAIT
// runs before a job of its priority submitted after it, although that one was queued
// before the retry came due, and before a job of a lower priority.
func TestSpecRetryKeepsItsPlaceInTheQueue(t *testing.T) {
	t.Parallel()
	clk := jobbustest.NewClock(time.Now())
	s := setup(t, withClock(clk, func(c *coordinator.Config) {
		c.RetryBaseDelay, c.RetryMaxDelay = time.Second, time.Second
		c.AgingStep = 24 * time.Hour // no aging: the order is the base priority, then the sequence
	}))
	w := s.worker("w", 1)
	c := s.client()
	high := func(text string, maxAttempts int) string {
		return submitRaw(t, c, fmt.Sprintf(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":%q},"maxAttempts":%d,"priority":"HIGH"}`, text, maxAttempts))
	}

	first := high("first", 2)
	a := w.ExpectAssign(first)
	clk.Advance(10 * time.Millisecond)
	next := high("takes the slot the failure frees", 1)
	clk.Advance(10 * time.Millisecond)
	later := high("queued before the retry", 1)
	normal := c.Submit("SHA256", `{"text":"normal"}`)

	w.MustSend(&protocol.TaskResult{WorkerID: "w", JobID: first, AttemptID: a.AttemptID, Success: false, Error: ptr("boom")})
	b := w.ExpectAssign(next)
	s.waitState(first, protocol.StateRetryWait)
	clk.Advance(2 * time.Second) // the retry comes due: QUEUED again, behind later in time
	s.waitState(first, protocol.StateQueued)
	finish(w, "w", b)
	order := finishInOrder(t, w, 3)
	if want := []string{first, later, normal}; strings.Join(order, ",") != strings.Join(want, ",") {
		t.Fatalf("order %v, want %v: the retry (HIGH, sequence 1) first", order, want)
	}
	if j := s.waitState(first, protocol.StateCompleted); j.Priority != protocol.PriorityHigh || j.Attempts != 2 {
		t.Fatalf("retried job %+v, want HIGH after 2 attempts", j)
	}
}

// TestSpecAgingIsCappedAtHigh: PROTOCOL.md, effective priority is the base level
// "raised by one for every whole --aging-step-millis ... capped at HIGH", and "Ties at
// equal effective priority are broken by ... submission sequence". A LOW job aged two
// steps ties with HIGH jobs, however long they waited, and the earliest submission
// runs first.
func TestSpecAgingIsCappedAtHigh(t *testing.T) {
	t.Parallel()
	clk := jobbustest.NewClock(time.Now())
	s := setup(t, withClock(clk, func(c *coordinator.Config) { c.AgingStep = time.Minute }))
	c := s.client()
	submit := func(p protocol.Priority, text string) string {
		return submitRaw(t, c, fmt.Sprintf(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":%q},"maxAttempts":1,"priority":%q}`, text, p))
	}
	low := submit(protocol.PriorityLow, "low, aged to HIGH")
	high := submit(protocol.PriorityHigh, "high, submitted after it")
	clk.Advance(2*time.Minute - time.Millisecond) // one step: low is NORMAL, high HIGH
	highLater := submit(protocol.PriorityHigh, "high, submitted nearly two steps later")
	clk.Advance(time.Millisecond) // low: two steps, HIGH; high: HIGH, not 4
	w := s.worker("w", 1)
	order := finishInOrder(t, w, 3)
	if want := []string{low, high, highLater}; strings.Join(order, ",") != strings.Join(want, ",") {
		t.Fatalf("order %v, want %v", order, want)
	}
}

// TestSpecMaxAttemptsNotPositiveIsTheDefault: PROTOCOL.md, "maxAttempts ≤ 0 → server
// default", and an idempotency key compares the effective max attempts.
func TestSpecMaxAttemptsNotPositiveIsTheDefault(t *testing.T) {
	t.Parallel()
	s := setup(t, withCoordinator(func(c *coordinator.Config) { c.MaxAttempts = 4 }))
	c := s.client()
	for _, tc := range []struct{ name, field string }{
		{"Zero", `"maxAttempts":0,`}, {"Negative", `"maxAttempts":-1,`},
		{"MostNegative", `"maxAttempts":-9223372036854775808,`}, {"Absent", ``},
	} {
		id := submitRaw(t, c, `{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"x"},`+tc.field+`"idempotencyKey":null}`)
		if j := s.job(id); j.MaxAttempts != 4 {
			t.Errorf("%s: maxAttempts %d, want the coordinator's default 4", tc.name, j.MaxAttempts)
		}
	}
	id := submitRaw(t, c, `{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"k"},"maxAttempts":-7,"idempotencyKey":"k"}`)
	if again := submitRaw(t, c, `{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"k"},"maxAttempts":4,"idempotencyKey":"k"}`); again != id {
		t.Fatalf("the key with the default's value got job %s, want %s", again, id)
	}
	if err := c.SendPayload([]byte(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"k"},"maxAttempts":3,"idempotencyKey":"k"}`)); err != nil {
		t.Fatal(err)
	}
	c.ExpectError(protocol.IdempotencyConflict("k", id).Message)
}

// TestSpecUnknownFieldsAreIgnored: PROTOCOL.md, "Unknown fields in known messages are
// ignored (forward compatibility)", "Adding "v":1 to the envelope is the documented
// upgrade path". Every message a spec peer sends, with fields the spec does not
// define, is served as without them on both ports.
func TestSpecUnknownFieldsAreIgnored(t *testing.T) {
	t.Parallel()
	s := setup(t)
	const extra = `"v":1,"x-extra":{"nested":[1,"two",null]},`
	with := func(msg string) []byte { // extra members first and last
		return []byte(strings.Replace(msg[:len(msg)-1], `{`, `{`+extra, 1) + `,"zz":true}`)
	}
	w := dial(t, s.br.WorkerAddr())
	if err := w.SendPayload(with(`{"type":"WORKER_REGISTER","workerId":"w","capacity":1}`)); err != nil {
		t.Fatal(err)
	}
	if b, err := w.RecvRaw(); err != nil || string(b) != `{"type":"WORKER_REGISTERED","workerId":"w"}` {
		t.Fatalf("registration with unknown fields answered %s (err %v)", b, err)
	}
	if err := w.SendPayload(with(`{"type":"HEARTBEAT","workerId":"w"}`)); err != nil {
		t.Fatal(err)
	}
	c := s.client()
	send := func(msg string) protocol.Message {
		t.Helper()
		if err := c.SendPayload(with(msg)); err != nil {
			t.Fatal(err)
		}
		return c.MustRecv()
	}
	m := send(`{"type":"SUBMIT_JOB","taskType":"WORD_COUNT","payload":{"text":"a b"},"maxAttempts":2,"idempotencyKey":"u","priority":"LOW"}`)
	js, ok := m.(*protocol.JobSubmitted)
	if !ok {
		t.Fatalf("SUBMIT_JOB with unknown fields answered %T %+v", m, m)
	}
	a := w.ExpectAssign(js.JobID)
	res, _ := json.Marshal(map[string]any{"workerId": "w", "jobId": a.JobID, "attemptId": a.AttemptID, "success": true, "result": "2", "error": nil})
	if err := w.SendPayload(with(`{"type":"TASK_RESULT",` + string(res[1:]))); err != nil {
		t.Fatal(err)
	}
	if j := s.waitState(js.JobID, protocol.StateCompleted); deref(j.Result) != "2" || j.MaxAttempts != 2 || j.Priority != protocol.PriorityLow {
		t.Fatalf("job %+v result %s, want COMPLETED 2, maxAttempts 2, LOW", j, deref(j.Result))
	}
	if st, ok := send(`{"type":"GET_JOB_STATUS","jobId":"` + js.JobID + `"}`).(*protocol.JobStatus); !ok || st.Job.JobID != js.JobID {
		t.Fatalf("GET_JOB_STATUS with unknown fields: %+v", st)
	}
	if l, ok := send(`{"type":"LIST_JOBS"}`).(*protocol.JobList); !ok || len(l.Jobs) != 1 {
		t.Fatalf("LIST_JOBS with unknown fields: %+v", l)
	}
	if l, ok := send(`{"type":"LIST_WORKERS"}`).(*protocol.WorkerList); !ok || len(l.Workers) != 1 {
		t.Fatalf("LIST_WORKERS with unknown fields: %+v", l)
	}
	if jc, ok := send(`{"type":"CANCEL_JOB","jobId":"` + js.JobID + `"}`).(*protocol.JobCancel); !ok || jc.Cancelled || jc.Job.State != protocol.StateCompleted {
		t.Fatalf("CANCEL_JOB with unknown fields: %+v", jc)
	}
}

// TestSpecMemberNamesAreCaseSensitive: JSON member names are case-sensitive, so a
// member whose name differs from a spec field's only in case ("MaxAttempts",
// "JOBID") is an unknown field, which PROTOCOL.md says is ignored: it must neither
// replace the field's value nor stand in for an absent field.
func TestSpecMemberNamesAreCaseSensitive(t *testing.T) {
	t.Parallel()
	s := setup(t)
	w := dial(t, s.br.WorkerAddr())
	if err := w.SendPayload([]byte(`{"type":"WORKER_REGISTER","workerId":"w","capacity":2,"Capacity":0,"WORKERID":"other"}`)); err != nil {
		t.Fatal(err)
	}
	if b, err := w.RecvRaw(); err != nil || string(b) != `{"type":"WORKER_REGISTERED","workerId":"w"}` {
		t.Fatalf("registration answered %s (err %v), want WORKER_REGISTERED for w", b, err)
	}
	c := s.client()
	id := submitRaw(t, c, `{"type":"SUBMIT_JOB","taskType":"SHA256","TaskType":"SLEEP","payload":{"text":"x"},"maxAttempts":2,"MaxAttempts":7,"Priority":"HIGH"}`)
	if j := s.job(id); j.TaskType != "SHA256" || j.MaxAttempts != 2 || j.Priority != protocol.PriorityNormal {
		t.Fatalf("job %+v, want SHA256 with maxAttempts 2 and priority NORMAL", j)
	}
	a := w.ExpectAssign(id)
	if err := w.SendPayload([]byte(`{"type":"TASK_RESULT","workerId":"w","jobId":"` + a.JobID + `","attemptId":"` + a.AttemptID +
		`","success":true,"Success":false,"result":"r","Result":"R","error":null,"Error":"e"}`)); err != nil {
		t.Fatal(err)
	}
	if j := s.waitState(id, protocol.StateCompleted); deref(j.Result) != "r" || j.Error != nil {
		t.Fatalf("job %+v result %s error %s, want COMPLETED with result r and no error", j, deref(j.Result), deref(j.Error))
	}
	// A member named like a field in another case is no field at all: the request
	// lacks the field, as if the member were absent.
	if err := c.SendPayload([]byte(`{"type":"GET_JOB_STATUS","JobId":"` + id + `"}`)); err != nil {
		t.Fatal(err)
	}
	c.ExpectError(protocol.UnknownJob("").Message)
	// And the type is named by "type" alone.
	if err := c.SendPayload([]byte(`{"TYPE":"LIST_WORKERS"}`)); err != nil {
		t.Fatal(err)
	}
	c.ExpectErrorThenClosed("Malformed request: ")
}

// TestSpecSnapshotTimesNeverGoBack: a snapshot's updatedAtMillis is when the job last
// changed, so never before its createdAtMillis nor before an earlier update, even when
// the coordinator's clock steps back (createdAtMillis already never does: submission
// order is age order).
func TestSpecSnapshotTimesNeverGoBack(t *testing.T) {
	t.Parallel()
	clk := jobbustest.NewClock(time.Now())
	s := setup(t, withClock(clk, nil))
	c := s.client()
	first := c.Submit("SHA256", `{"text":"before the step back"}`)
	before := s.job(first)
	clk.Advance(-time.Minute)
	second := c.Submit("SHA256", `{"text":"after it"}`)
	if j := s.job(second); j.UpdatedAtMillis < j.CreatedAtMillis || j.CreatedAtMillis < before.CreatedAtMillis {
		t.Errorf("job submitted after the clock stepped back: created %d, updated %d; the one before created %d",
			j.CreatedAtMillis, j.UpdatedAtMillis, before.CreatedAtMillis)
	}
	jc, ok := c.Request(&protocol.CancelJob{JobID: first}).(*protocol.JobCancel)
	if !ok || !jc.Cancelled {
		t.Fatalf("cancel: %+v", jc)
	}
	if jc.Job.UpdatedAtMillis < before.UpdatedAtMillis {
		t.Errorf("cancelled after the clock stepped back: updated %d, before that %d", jc.Job.UpdatedAtMillis, before.UpdatedAtMillis)
	}
}

// TestSpecRequestsFillingAFrame: PROTOCOL.md, "Maximum frame: 1 MiB" and "Unknown
// fields in known messages are ignored". Each client request, padded with a field no
// message defines to exactly the largest frame, is answered as it is without the
// padding: the bridge forwards what the coordinator needs, not a NATS message that
// cannot hold the frame and the request's headers.
func TestSpecRequestsFillingAFrame(t *testing.T) {
	t.Parallel()
	s := setup(t)
	c := s.client()
	id := c.Submit("SHA256", `{"text":"x"}`)
	padded := func(msg string) []byte {
		msg = msg[:len(msg)-1] + `,"pad":"`
		return []byte(msg + strings.Repeat("p", frame.MaxSize-len(msg)-2) + `"}`)
	}
	for _, tc := range []struct{ req, want string }{
		{`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"y"},"maxAttempts":1,"idempotencyKey":"padded"}`, "JOB_SUBMITTED"},
		{`{"type":"GET_JOB_STATUS","jobId":"` + id + `"}`, "JOB_STATUS"},
		{`{"type":"LIST_JOBS"}`, "JOB_LIST"},
		{`{"type":"LIST_WORKERS"}`, "WORKER_LIST"},
		{`{"type":"CANCEL_JOB","jobId":"` + id + `"}`, "JOB_CANCEL"},
	} {
		p := padded(tc.req)
		if len(p) != frame.MaxSize {
			t.Fatalf("frame of %d bytes", len(p))
		}
		if err := c.SendPayload(p); err != nil {
			t.Fatal(err)
		}
		if m := c.MustRecv(); string(m.MessageType()) != tc.want {
			t.Errorf("%s padded to %d bytes: got %+v, want %s", tc.req, len(p), m, tc.want)
		}
	}
	if j := s.job(id); j.State != protocol.StateCancelled {
		t.Errorf("job %+v, want CANCELLED by the padded CANCEL_JOB", j)
	}
}

// TestSpecUnknownJobOfAnyLength: PROTOCOL.md, GET_JOB_STATUS and CANCEL_JOB of an
// "unknown id → ERROR", and "A misbehaving peer costs only its own connection". A job
// id of thousands of characters, which no job has, is answered Unknown job like any
// other, and costs nothing else: the coordinator once looked it up in KV, a subject
// longer than NATS's control line, and the server closed the coordinator's connection.
func TestSpecUnknownJobOfAnyLength(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.specWorker("healthy", 2)
	c := s.client()
	for _, n := range []int{100, 4000, 5000, 100_000} {
		id := strings.Repeat("x", n)
		for _, req := range []protocol.Message{&protocol.GetJobStatus{JobID: id}, &protocol.CancelJob{JobID: id}} {
			m, ok := c.Request(req).(*protocol.Error)
			if !ok || m.Message != protocol.UnknownJob(id).Message {
				t.Fatalf("%s of a job id of %d characters: got %.200v, want Unknown job", req.MessageType(), n, m)
			}
		}
	}
	s.healthy(2)
}

// TestSpecUnknownJobOfAFrameIsAnswered: PROTOCOL.md, GET_JOB_STATUS and CANCEL_JOB of an
// "unknown id → ERROR". A job id of 600,000 characters fits in a frame, and is answered
// Unknown job at once, like any other: the ERROR names the id cut short. Echoed whole,
// in the reply's body and again in its error header, it once made a reply larger than
// a NATS message; the coordinator's reply was lost, the status answered "coordinator
// unavailable" after the request timeout, and the cancel "Outcome unknown", as if a
// job might have been cancelled.
func TestSpecUnknownJobOfAFrameIsAnswered(t *testing.T) {
	t.Parallel()
	s := setup(t)
	c := s.client()
	id := strings.Repeat("x", 600_000)
	for _, req := range []protocol.Message{&protocol.GetJobStatus{JobID: id}, &protocol.CancelJob{JobID: id}} {
		m, ok := c.Request(req).(*protocol.Error)
		if want := "Unknown job: " + id[:protocol.MaxJobID]; !ok || !strings.HasPrefix(m.Message, want) || len(m.Message) > 1024 {
			t.Fatalf("%s of a job id of %d characters: got %.200v, want Unknown job naming it cut short", req.MessageType(), len(id), m)
		}
	}
}

// TestSpecRefusalEchoingMostOfAFrameIsAnswered: a SUBMIT_JOB whose task type no worker
// runs is refused with an ERROR, which means nothing was stored; so is one of a task
// type of 600,000 characters (it fits in a frame), at once. The coordinator's ERROR
// echoes the type, in its body and once more in micro's error header, and the two made
// a reply larger than a NATS message: it was lost, and the bridge answered after its
// request timeout "Outcome unknown: ... may or may not be stored", though nothing was.
func TestSpecRefusalEchoingMostOfAFrameIsAnswered(t *testing.T) {
	t.Parallel()
	s := setup(t)
	c := s.client()
	taskType := strings.Repeat("x", 600_000)
	m, ok := c.Request(&protocol.SubmitJob{TaskType: taskType, Payload: []byte(`{}`)}).(*protocol.Error)
	if want := protocol.UnknownTaskType(taskType).Message; !ok || m.Message != want {
		t.Fatalf("submission of a task type of %d characters: got %.200v, want Unknown task type", len(taskType), m)
	}
	if l, ok := c.Request(&protocol.ListJobs{}).(*protocol.JobList); !ok || len(l.Jobs) != 0 {
		t.Fatalf("jobs %+v, want none", l)
	}
}

// TestSpecWorkerListOfMoreThanAFrame: PROTOCOL.md, LIST_WORKERS is answered WORKER_LIST.
// 2,100 live workers of ids of some 500 characters (registered over NATS, as native
// workers are) take more than a frame, and more than a NATS message: the list holds as
// many as fit, by worker id, as JOB_LIST holds the newest jobs that fit. The whole list
// once made a reply larger than a NATS message, which was lost: LIST_WORKERS was
// answered "coordinator unavailable: no reply" after the request timeout.
func TestSpecWorkerListOfMoreThanAFrame(t *testing.T) {
	t.Parallel()
	s := setup(t)
	const n = 2100
	for i := range n {
		id := fmt.Sprintf("w-%04d-%s", i, strings.Repeat("x", 500))
		body := fmt.Sprintf(`{"type":"WORKER_REGISTER","workerId":%q,"capacity":1}`, id)
		if _, err := s.NC.Request("jobbus.role.coordinator.worker."+id+".worker.register", []byte(body), waitFor); err != nil {
			t.Fatal(err)
		}
	}
	c := s.client()
	if err := c.SendPayload([]byte(`{"type":"LIST_WORKERS"}`)); err != nil {
		t.Fatal(err)
	}
	data, err := c.RecvRaw()
	if err != nil {
		t.Fatal(err)
	}
	m, err := protocol.Decode(data)
	l, ok := m.(*protocol.WorkerList)
	if err != nil || !ok || len(l.Workers) == 0 || len(l.Workers) >= n {
		t.Fatalf("LIST_WORKERS of %d workers answered %.200s, want a WORKER_LIST of those that fit", n, data)
	}
	for i, w := range l.Workers {
		if want := fmt.Sprintf("w-%04d-", i); !strings.HasPrefix(w.WorkerID, want) {
			t.Fatalf("worker %d is %.10s..., want %s...: the first by id", i, w.WorkerID, want)
		}
	}
	t.Logf("%d of %d workers in %d bytes", len(l.Workers), n, len(data))
}
