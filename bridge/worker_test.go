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
)

func ptr[T any](v T) *T { return &v }

func TestWorkerPort(t *testing.T) {
	t.Parallel()

	t.Run("FullSpecWorkerFlow", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		w := s.worker("worker-1", 2) // checks WORKER_REGISTERED byte for byte
		c := s.client()
		id := c.Submit("WORD_COUNT", `{"text":"one two three"}`)
		a := w.ExpectAssign(id)
		if a.AttemptNumber != 1 || a.TaskType != "WORD_COUNT" || string(a.Payload) != `{"text":"one two three"}` || a.AttemptID == "" {
			t.Fatalf("TASK_ASSIGN %+v", a)
		}
		if j := s.job(id); j.State != protocol.StateRunning || j.WorkerID == nil || *j.WorkerID != "worker-1" {
			t.Fatalf("job %+v, want RUNNING on worker-1", j)
		}
		w.MustSend(&protocol.TaskResult{WorkerID: "worker-1", JobID: id, AttemptID: a.AttemptID, Success: true, Result: ptr("3")})
		j := s.waitState(id, protocol.StateCompleted)
		if j.Result == nil || *j.Result != "3" || j.Attempts != 1 {
			t.Fatalf("job %+v, want COMPLETED with result 3", j)
		}
		st, ok := c.Request(&protocol.GetJobStatus{JobID: id}).(*protocol.JobStatus)
		if !ok || st.Job.State != protocol.StateCompleted {
			t.Fatalf("status over the client port: %+v", st)
		}
	})

	t.Run("FirstMessageRules", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		for _, tc := range []struct {
			name    string
			payload string
			want    string
		}{
			{"Heartbeat", `{"type":"HEARTBEAT","workerId":"w"}`, "First message must be WORKER_REGISTER"},
			{"ClientRequest", `{"type":"LIST_JOBS"}`, "First message must be WORKER_REGISTER"},
			{"TaskResult", `{"type":"TASK_RESULT","workerId":"w","jobId":"j","attemptId":"a","success":true,"result":null,"error":null}`, "First message must be WORKER_REGISTER"},
			{"CapacityZero", `{"type":"WORKER_REGISTER","workerId":"w","capacity":0}`, protocol.BadRegistration().Message},
			{"Capacity1025", `{"type":"WORKER_REGISTER","workerId":"w","capacity":1025}`, protocol.BadRegistration().Message},
			{"CapacityAbsent", `{"type":"WORKER_REGISTER","workerId":"w"}`, protocol.BadRegistration().Message},
			{"EmptyID", `{"type":"WORKER_REGISTER","workerId":"","capacity":4}`, protocol.BadRegistration().Message},
			{"BlankID", `{"type":"WORKER_REGISTER","workerId":"   ","capacity":4}`, protocol.BadRegistration().Message},
			{"TabsAndNewlinesID", `{"type":"WORKER_REGISTER","workerId":"\t\n","capacity":4}`, protocol.BadRegistration().Message},
			{"HugeID", fmt.Sprintf(`{"type":"WORKER_REGISTER","workerId":%q,"capacity":4}`, strings.Repeat("w", 600)), protocol.BadRegistration().Message},
			{"NonJSON", `WORKER_REGISTER please`, "Malformed request: "},
			{"UnknownType", `{"type":"HELLO"}`, "Malformed request: "},
			{"CapacityAsString", `{"type":"WORKER_REGISTER","workerId":"w","capacity":"4"}`, "Malformed request: "},
		} {
			t.Run(tc.name, func(t *testing.T) {
				p := dial(t, s.br.WorkerAddr())
				if err := p.SendPayload([]byte(tc.payload)); err != nil {
					t.Fatal(err)
				}
				p.ExpectErrorThenClosed(tc.want)
			})
		}
		if ws, err := s.native.Workers(t.Context()); err != nil || len(ws) != 0 {
			t.Fatalf("workers %v (err %v), want none", ws, err)
		}
	})

	t.Run("HeartbeatsKeepTheWorkerAlive", func(t *testing.T) {
		t.Parallel()
		s := setup(t, withCoordinator(func(c *coordinator.Config) { c.HeartbeatTimeout = 500 * time.Millisecond }))
		w := s.worker("beating", 1)
		stop := make(chan struct{})
		beats := make(chan struct{})
		go func() {
			defer close(beats)
			tick := time.NewTicker(25 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					_ = w.Send(&protocol.Heartbeat{WorkerID: "beating"})
				}
			}
		}()
		// A running attempt survives many heartbeat timeouts: a loss, even one the
		// bridge repaired by registering again, would have sent it to retry.
		id := s.client().Submit("SLEEP", `{"durationMillis":600000}`)
		a := w.ExpectAssign(id)
		time.Sleep(5 * s.Config.HeartbeatTimeout) // the span observed, not a synchronisation
		if j := s.job(id); j.State != protocol.StateRunning || j.Attempts != 1 || j.Error != nil {
			t.Fatalf("job %+v, want still RUNNING its first attempt", j)
		}
		close(stop)
		<-beats
		eventually(t, "silent worker lost", func() bool { return !s.hasWorker("beating") })
		// Beating again: the coordinator answers "unknown worker" and the bridge
		// registers it again on the worker's behalf, with its original registration.
		eventually(t, "job lost with its worker", func() bool {
			j := s.job(id)
			return j.Error != nil && strings.HasPrefix(*j.Error, "worker beating lost")
		})
		_ = w.Send(&protocol.Heartbeat{WorkerID: "beating"})
		eventually(t, "worker registered again", func() bool { return s.hasWorker("beating") })
		w.MustSend(&protocol.TaskResult{WorkerID: "beating", JobID: id, AttemptID: a.AttemptID, Success: true}) // stale now
		a2 := w.ExpectAssign(id)
		if a2.AttemptNumber != 2 {
			t.Fatalf("retry %+v", a2)
		}
	})

	t.Run("ClosedConnectionLosesTheWorkerAtOnce", func(t *testing.T) {
		t.Parallel()
		s := setup(t) // heartbeat timeout 1h: only the disconnect can lose the worker
		w := s.worker("closer", 1)
		id := s.client().Submit("SLEEP", `{"durationMillis":600000}`)
		w.ExpectAssign(id)
		_ = w.Close()
		eventually(t, "job back to retry", func() bool {
			j := s.job(id)
			return j.Error != nil && *j.Error == "worker closer lost (connection closed)"
		})
		if j := s.job(id); j.State == protocol.StateRunning || j.Attempts != 1 {
			t.Fatalf("job %+v", j)
		}
		eventually(t, "worker gone", func() bool { return !s.hasWorker("closer") })
	})

	t.Run("ResultThenCloseStillCounts", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		w := s.worker("quick", 1)
		id := s.client().Submit("SHA256", `{"text":"x"}`)
		a := w.ExpectAssign(id)
		w.MustSend(&protocol.TaskResult{WorkerID: "quick", JobID: id, AttemptID: a.AttemptID, Success: true, Result: ptr("ok")})
		_ = w.Close() // the loss must not overtake the result
		j := s.waitState(id, protocol.StateCompleted)
		if j.Attempts != 1 || j.Error != nil {
			t.Fatalf("job %+v", j)
		}
	})

	t.Run("AnotherWorkersAttemptDoesNotCount", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		owner := s.worker("owner", 1)
		id := s.client().Submit("SHA256", `{"text":"x"}`)
		a := owner.ExpectAssign(id)
		// Another TCP worker offers a result for the owner's attempt, in the owner's
		// name too: the bridge sends it as the worker that sent it, and the
		// coordinator refuses (403) a result for an attempt it assigned to another.
		other := s.worker("other", 1)
		refusals := s.br.Stats().Results.Refused
		other.MustSend(&protocol.TaskResult{WorkerID: "owner", JobID: id, AttemptID: a.AttemptID, Success: true, Result: ptr("forged")})
		eventually(t, "the forged result refused", func() bool { return s.br.Stats().Results.Refused > refusals })
		if j := s.job(id); j.State != protocol.StateRunning || deref(j.WorkerID) != "owner" {
			t.Fatalf("job after the forged result %+v, want RUNNING on owner", j)
		}
		owner.MustSend(&protocol.TaskResult{WorkerID: "owner", JobID: id, AttemptID: a.AttemptID, Success: true, Result: ptr("genuine")})
		if j := s.waitState(id, protocol.StateCompleted); deref(j.Result) != "genuine" || j.Attempts != 1 {
			t.Fatalf("job %+v, want the owner's result", j)
		}
	})

	t.Run("FailedResultIsRetried", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		w := s.worker("failing", 1)
		id := s.client().Submit("FAIL", `{"failUntilAttempt":2}`)
		a := w.ExpectAssign(id)
		w.MustSend(&protocol.TaskResult{WorkerID: "failing", JobID: id, AttemptID: a.AttemptID, Error: ptr("deliberate failure on attempt 1 (failing until 2)")})
		a2 := w.ExpectAssign(id)
		if a2.AttemptNumber != 2 || a2.AttemptID == a.AttemptID {
			t.Fatalf("second assignment %+v", a2)
		}
		w.MustSend(&protocol.TaskResult{WorkerID: "failing", JobID: id, AttemptID: a2.AttemptID, Success: true, Result: ptr("succeeded on attempt 2")})
		if j := s.waitState(id, protocol.StateCompleted); *j.Error != "deliberate failure on attempt 1 (failing until 2)" {
			t.Fatalf("job %+v", j)
		}
	})

	t.Run("ClientCancelSendsTaskCancel", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		w := s.worker("cancellee", 1)
		c := s.client()
		id := c.Submit("SLEEP", `{"durationMillis":600000}`)
		a := w.ExpectAssign(id)
		jc, ok := c.Request(&protocol.CancelJob{JobID: id}).(*protocol.JobCancel)
		if !ok || !jc.Cancelled || jc.Job.State != protocol.StateCancelled {
			t.Fatalf("JOB_CANCEL %+v", jc)
		}
		m := w.MustRecv()
		if tc, ok := m.(*protocol.TaskCancel); !ok || tc.JobID != id || tc.AttemptID != a.AttemptID {
			t.Fatalf("got %T %+v, want TASK_CANCEL of %s/%s", m, m, id, a.AttemptID)
		}
	})

	// PROTOCOL.md: "TASK_CANCEL follows a revoked lease", and a worker acts on it
	// "only when both jobId and attemptId match what it runs". The coordinator sends
	// an attempt's TASK_ASSIGN before its TASK_CANCEL; a cancel written to the worker
	// ahead of its assignment is ignored, and the worker runs an attempt whose lease
	// is gone while the coordinator counts its slot free. Each job here is cancelled
	// as soon as it is submitted, so its cancel follows its assignment closely.
	t.Run("TaskCancelNeverOvertakesItsAssignment", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		w := s.worker("overtaken", 1024)
		c := s.client()
		const jobs = 200
		for range jobs {
			id := c.Submit("SLEEP", `{"durationMillis":600000}`)
			if jc, ok := c.Request(&protocol.CancelJob{JobID: id}).(*protocol.JobCancel); !ok || !jc.Cancelled {
				t.Fatalf("JOB_CANCEL %+v", jc)
			}
		}
		assigned := make(map[string]bool, jobs)
		var overtaken []string
		for range 2 * jobs {
			switch m := w.MustRecv().(type) {
			case *protocol.TaskAssign:
				assigned[m.AttemptID] = true
			case *protocol.TaskCancel:
				if !assigned[m.AttemptID] {
					overtaken = append(overtaken, m.JobID)
				}
			default:
				t.Fatalf("got %T %+v, want TASK_ASSIGN or TASK_CANCEL", m, m)
			}
		}
		if len(overtaken) > 0 {
			t.Fatalf("%d of %d TASK_CANCELs came before their TASK_ASSIGN (jobs %v)", len(overtaken), jobs, overtaken)
		}
	})

	t.Run("ReRegisteringSupersedes", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		old := s.worker("twin", 1)
		c := s.client()
		first := c.Submit("SLEEP", `{"durationMillis":600000}`)
		a := old.ExpectAssign(first)

		fresh := s.worker("twin", 2)
		old.ExpectClosed()
		// The first attempt died with the old session; the job is retried on the new one.
		a2 := fresh.ExpectAssign(first)
		if a2.AttemptNumber != 2 || a2.AttemptID == a.AttemptID {
			t.Fatalf("retry %+v", a2)
		}
		if j := s.job(first); j.Error == nil || *j.Error != "worker twin lost (worker re-registered)" {
			t.Fatalf("job %+v", j)
		}
		// The old session's end did not remove the new registration.
		second := c.Submit("SHA256", `{"text":"x"}`)
		fresh.ExpectAssign(second)
		ws, err := s.native.Workers(t.Context())
		if err != nil || len(ws) != 1 || ws[0].WorkerID != "twin" || ws[0].Capacity != 2 {
			t.Fatalf("workers %+v (err %v), want the new twin of capacity 2", ws, err)
		}
	})

	t.Run("CoordinatorRestartRegistersAgain", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		w := s.worker("survivor", 1)
		s.RestartCoordinator(t)
		if s.hasWorker("survivor") {
			t.Fatal("a new coordinator knows the worker already")
		}
		_ = w.Send(&protocol.Heartbeat{WorkerID: "survivor"})
		eventually(t, "worker registered again", func() bool { return s.hasWorker("survivor") })
		id := s.client().Submit("SHA256", `{"text":"x"}`)
		a := w.ExpectAssign(id) // on the same connection, with no second WORKER_REGISTERED
		w.MustSend(&protocol.TaskResult{WorkerID: "survivor", JobID: id, AttemptID: a.AttemptID, Success: true, Result: ptr("r")})
		s.waitState(id, protocol.StateCompleted)
	})

	t.Run("AfterRegistrationOnlyHeartbeatAndResult", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		for _, tc := range []struct {
			name, payload, want string
		}{
			{"SecondRegister", `{"type":"WORKER_REGISTER","workerId":"x","capacity":1}`, protocol.UnexpectedType(protocol.TypeWorkerRegister, "worker").Message},
			{"ClientRequest", `{"type":"LIST_WORKERS"}`, protocol.UnexpectedType(protocol.TypeListWorkers, "worker").Message},
			{"CoordinatorMessage", `{"type":"TASK_ASSIGN","jobId":"j","attemptId":"a","attemptNumber":1,"taskType":"SLEEP","payload":{}}`, protocol.UnexpectedType(protocol.TypeTaskAssign, "worker").Message},
			{"NonJSON", `{"type":`, "Malformed request: "},
			{"UnknownType", `{"type":"BYE"}`, "Malformed request: "},
			{"WrongFieldTypes", `{"type":"TASK_RESULT","workerId":"x","jobId":"j","attemptId":"a","success":"yes"}`, "Malformed request: "},
		} {
			t.Run(tc.name, func(t *testing.T) {
				id := "after-" + tc.name
				w := s.worker(id, 1)
				if err := w.SendPayload([]byte(tc.payload)); err != nil {
					t.Fatal(err)
				}
				w.ExpectErrorThenClosed(tc.want)
				eventually(t, "worker lost", func() bool { return !s.hasWorker(id) })
			})
		}
	})

	t.Run("RegistrationWaitsForACoordinator", func(t *testing.T) {
		t.Parallel()
		s := setup(t, noCoordinator())
		p := dial(t, s.br.WorkerAddr())
		p.MustSend(&protocol.WorkerRegister{WorkerID: "early", Capacity: 1})
		s.StartCoordinator(t) // while the registration waits
		if _, ok := p.MustRecv().(*protocol.WorkerRegistered); !ok {
			t.Fatal("a worker registering before the coordinator started was not registered")
		}
		eventually(t, "worker early listed", func() bool { return s.hasWorker("early") })
	})

	t.Run("NoCoordinator", func(t *testing.T) {
		t.Parallel()
		s := setup(t, noCoordinator(), withBridge(func(c *bridgeConfig) { c.RequestTimeout = 200 * time.Millisecond }))
		p := dial(t, s.br.WorkerAddr())
		p.MustSend(&protocol.WorkerRegister{WorkerID: "lonely", Capacity: 1})
		p.ExpectErrorThenClosed("coordinator unavailable: no coordinator is serving worker.register")
	})

	t.Run("TaskTypesExtensionDeclaresAndRoutes", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		spec := s.worker("spec", 4) // the five built-ins, and more free slots than picky
		w := dial(t, s.br.WorkerAddr())
		reg := `{"type":"WORKER_REGISTER","workerId":"picky","capacity":1,"taskTypes":[` +
			`{"name":"RESIZE","schema":{"type":"object","required":["url"],"properties":{"url":{"type":"string"}}},"options":{"maxAttempts":5}},"SHA256"]}`
		if err := w.SendPayload([]byte(reg)); err != nil {
			t.Fatal(err)
		}
		if _, ok := w.MustRecv().(*protocol.WorkerRegistered); !ok {
			t.Fatal("picky was not registered")
		}
		c := s.client()
		if e, ok := c.Request(&protocol.SubmitJob{TaskType: "RESIZE", Payload: json.RawMessage(`{"url":5}`)}).(*protocol.Error); !ok ||
			e.Message != "Invalid payload: at '/url': got number, want string" {
			t.Fatalf("invalid RESIZE answered %+v", e)
		}
		id := c.Submit("RESIZE", `{"url":"https://example.com/a.png"}`)
		a := w.ExpectAssign(id) // never spec's, though spec has more free slots
		w.MustSend(&protocol.TaskResult{WorkerID: "picky", JobID: id, AttemptID: a.AttemptID, Error: ptr("404 not found"), Permanent: true})
		j := s.waitState(id, protocol.StateFailed)
		if j.Attempts != 1 || j.MaxAttempts != 5 || j.Error == nil || *j.Error != "404 not found (permanent failure on attempt 1 of 5; not retried)" {
			t.Fatalf("job %+v, want FAILED after one attempt of 5, not retried", j)
		}
		sha := c.Submit("SHA256", `{"text":"x"}`)
		spec.ExpectAssign(sha) // a built-in still goes to the freest worker
	})

	t.Run("TaskTypesExtensionRefused", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		for _, tc := range []struct{ name, types, want string }{
			{"BuiltinRedeclared", `[{"name":"SLEEP","schema":{"type":"object"}}]`, "Registration refused: task type SLEEP is built in"},
			{"BuiltinInAnotherCase", `[{"name":"word-count","schema":{"type":"object"}}]`, "Registration refused: task type word-count reads as WORD_COUNT, a built-in"},
			{"BadName", `["has space"]`, "Registration refused: bad task type name"},
			{"BadSchema", `[{"name":"X","schema":{"type":17}}]`, "Registration refused: task type X: schema:"},
			{"NegativeConcurrency", `[{"name":"X","options":{"concurrency":-1}}]`, "Registration refused: task type X: concurrency must not be negative"},
			// A JVM peer's Long.MAX_VALUE for "no deadline": past what a deadline can hold.
			{"TimeoutBeyondADeadline", `[{"name":"X","options":{"timeoutMillis":9223372036854775807}}]`,
				"Registration refused: task type X: timeoutMillis must be in 0..9223372036854, got 9223372036854775807"},
			{"NotAList", `"X"`, "Malformed request"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				w := dial(t, s.br.WorkerAddr())
				if err := w.SendPayload([]byte(`{"type":"WORKER_REGISTER","workerId":"w-` + tc.name + `","capacity":1,"taskTypes":` + tc.types + `}`)); err != nil {
					t.Fatal(err)
				}
				w.ExpectErrorThenClosed(tc.want)
			})
		}
	})
}

// TestWorkerRegisterTooLargeToForward: a WORKER_REGISTER that fits a frame but not a
// NATS message once the bridge wraps it (a task type declared with a schema of nearly
// a MiB) is answered with an ERROR that says it is too large to forward, as the client
// port answers such a request, never "coordinator unavailable": a coordinator is up,
// and registering again as it is cannot help. The bridge serves on.
func TestWorkerRegisterTooLargeToForward(t *testing.T) {
	t.Parallel()
	s := setup(t)
	prefix := `{"type":"WORKER_REGISTER","workerId":"big","capacity":1,"taskTypes":[{"name":"BIG","schema":{"description":"`
	suffix := `"}}]}`
	reg := prefix + strings.Repeat("x", frame.MaxSize-len(prefix)-len(suffix)) + suffix
	w := dial(t, s.br.WorkerAddr())
	if err := w.SendPayload([]byte(reg)); err != nil {
		t.Fatal(err)
	}
	w.ExpectErrorThenClosed("Request too large to forward: ")
	s.specWorker("small", 1)
	s.healthy(1)
}

// TestTCPWorkerTakesMoreAssignmentsThanTheWriteQueue: a spec worker may register a
// capacity of up to 1024 (PROTOCOL.md), more than the frames a worker connection
// queues (WriteQueue, 256 by default), and so be handed more assignments at once than
// the queue holds. One that reads every frame, but not at once (it pauses for a moment,
// far within the write timeout, as a process collecting its garbage does), must get
// them all: the frames behind a write in progress wait for it, and only a peer that
// takes no frame within the write timeout is dropped. Here the queue holds 8 frames and
// the worker is handed 160 jobs of 64 kB.
func TestTCPWorkerTakesMoreAssignmentsThanTheWriteQueue(t *testing.T) {
	t.Parallel()
	s := setup(t, withBridge(func(c *bridgeConfig) {
		c.WriteQueue = 8
		c.WriteTimeout = waitFor
	}))
	payload, _ := json.Marshal(map[string]string{"text": strings.Repeat("word ", 13_000)})
	const n = 160
	ids := map[string]bool{}
	for range n {
		id, err := s.native.Submit(t.Context(), "WORD_COUNT", json.RawMessage(payload))
		if err != nil {
			t.Fatal(err)
		}
		ids[id] = true
	}
	w := s.worker("wide", n) // the backlog comes at once
	// The worker's pause, not a wait for anything: meanwhile the socket buffers fill
	// (some 4 MB on loopback) and the writer blocks with frames behind it.
	time.Sleep(500 * time.Millisecond)
	assigned := make(chan string, n)
	w.Forward(func(m protocol.Message) {
		if a, ok := m.(*protocol.TaskAssign); ok {
			assigned <- a.JobID
		}
	})
	for range n {
		select {
		case id := <-assigned:
			delete(ids, id)
		case <-time.After(waitFor):
			t.Fatalf("%d of %d jobs never assigned; worker still listed: %v", len(ids), n, s.hasWorker("wide"))
		}
	}
	if !s.hasWorker("wide") {
		t.Fatal("the worker was dropped although it read every frame")
	}
	for id := range ids {
		t.Errorf("job %s not assigned", id)
	}
}
