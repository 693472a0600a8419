package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/jobbustest/suite"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/internal/workerproto"
)

const jobsStreamName = "KV_" + protocol.JobsBucket

// leadJobsStream makes node n of cl the JOBS stream's leader, as a stream leader moves
// in production (a restart, a stepdown), and waits until it is.
func leadJobsStream(t *testing.T, cl *jobbustest.Cluster, nc *nats.Conn, n int) {
	t.Helper()
	name := fmt.Sprintf("n%d", n)
	req := []byte(`{"placement":{"preferred":"` + name + `"}}`)
	testkit.Wait(t, 30*time.Second, func() error {
		if cl.Nodes[n].NATS().JetStreamIsStreamLeader("$G", jobsStreamName) {
			return nil
		}
		_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+jobsStreamName, req, time.Second)
		return errors.New(jobsStreamName + " not led by " + name)
	})
}

// settledOnN0 waits until a job is stored and run, makes n0 the JOBS stream's leader,
// and waits for one more: no write is left in flight when it returns.
func settledOnN0(t *testing.T, cl *jobbustest.Cluster, nc *nats.Conn, c *client.Client) {
	t.Helper()
	ran := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		id, err := c.Submit(ctx, "SHA256", text("before"))
		if err == nil {
			_, err = c.Wait(ctx, id)
		}
		return err
	}
	testkit.Wait(t, 60*time.Second, ran)
	leadJobsStream(t, cl, nc, 0)
	testkit.Wait(t, 30*time.Second, ran)
}

// TestUnconfirmedSettingIsOutcomeUnknown: a queue setting written while the JOBS
// stream has no quorum is proposed by its leader and not confirmed. The leader's store
// does not hold it yet, so a read-back finds the old setting; but the proposal is in
// the leader's log, and once a follower is back it is committed. So the answer is
// "Outcome unknown", never "settings not stored" for a setting that is stored
// afterwards. And once it is stored, the coordinator holds and enforces it (a rate
// limit too), though nobody sent it again: the queue is listed paused, and its job
// waits while another queue's runs.
func TestUnconfirmedSettingIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	cl, s := replicatedSystem(t, 10*time.Second) // outlasts the write: the answer is the store's, not "not serving"
	s.StartCoordinator(t)
	s.StartNativeWorker(t) // for the job of the test's end, and servesAfterQuorum's
	c := client.New(s.NC)
	ctx := context.Background()
	testkit.Wait(t, 60*time.Second, func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.SetQueue(rctx, "q", client.MaxRunning(1))
		return err
	})
	settledOnN0(t, cl, s.NC, c)

	cl.Stop(t, 1)
	cl.Stop(t, 2)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := c.PauseQueue(rctx, "q")
	cancel()
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("pause without a quorum: %v; want \"Outcome unknown\"", err)
	}
	t.Logf("answered: %v", err)
	rctx, cancel = context.WithTimeout(ctx, 15*time.Second)
	_, err = c.SetLimit(rctx, client.ForQueue("other"), "1/h", 1)
	cancel()
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("limit without a quorum: %v; want \"Outcome unknown\"", err)
	}

	// Node 0's log is ahead of node 1's: node 1 votes for it, and it commits the pause.
	cl.Restart(t, 1)
	subj := "$KV." + protocol.JobsBucket + "." + protocol.ControlPrefix + protocol.QueueControlPrefix + "q"
	testkit.Wait(t, 90*time.Second, func() error {
		data, err := storedMessage(s.NC, subj)
		if err != nil {
			return err
		}
		var st protocol.QueueSettings
		if err := json.Unmarshal(data, &st); err != nil || !st.Paused {
			return fmt.Errorf("queue q stored as %s", data)
		}
		return nil
	})

	// Nobody sends them again: the coordinator reads them back and holds them.
	testkit.Wait(t, 60*time.Second, func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		qs, err := c.Queues(rctx)
		if err != nil {
			return err
		}
		if i := slices.IndexFunc(qs, func(q protocol.QueueInfo) bool { return q.Name == "q" }); i < 0 || !qs[i].Paused {
			return fmt.Errorf("queues listed: %+v; want q paused", qs)
		}
		ls, err := c.Limits(rctx)
		if err != nil {
			return err
		}
		if len(ls) != 1 || ls[0].Name != "other" {
			return fmt.Errorf("limits listed: %+v", ls)
		}
		return nil
	})
	rctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	held, err := c.Submit(rctx, "SHA256", text("held"), client.Queue("q"))
	if err != nil {
		t.Fatal(err)
	}
	id, err := c.Submit(rctx, "SHA256", text("runs"))
	if err == nil {
		_, err = c.Wait(rctx, id)
	}
	if err != nil {
		t.Fatal(err)
	}
	if j, err := c.Status(rctx, held); err != nil || j.State != protocol.StateQueued {
		t.Errorf("job of the paused queue q: %+v, %v; want QUEUED", j, err)
	}
	servesAfterQuorum(t, s, c)
}

// servesAfterQuorum waits until, with the quorum back, the coordinator runs a job
// again, and fails the test if it fenced itself meanwhile: every write of the test
// was its own, late or refused while an earlier one was pending, never another
// coordinator's.
func servesAfterQuorum(t *testing.T, s *jobbustest.System, c *client.Client) {
	t.Helper()
	testkit.Wait(t, 90*time.Second, func() error {
		select {
		case <-s.Coordinator.Fenced():
			t.Fatalf("the coordinator fenced itself once the quorum was back: %v", s.Coordinator.FencedBy())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		id, err := c.Submit(ctx, "SHA256", text("after"))
		if err == nil {
			_, err = c.Wait(ctx, id)
		}
		return err
	})
	if err := s.Coordinator.FencedBy(); err != nil {
		t.Fatalf("the coordinator fenced itself once the quorum was back: %v", err)
	}
}

// storedMessage reads the last message of subj in the JOBS stream from its leader.
func storedMessage(nc *nats.Conn, subj string) ([]byte, error) {
	m, err := nc.Request("$JS.API.STREAM.MSG.GET."+jobsStreamName, []byte(`{"last_by_subj":"`+subj+`"}`), 5*time.Second)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *struct {
			Data []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil || resp.Message == nil {
		return nil, fmt.Errorf("read %s: %q, %v", subj, m.Data, err)
	}
	return resp.Message.Data, nil
}

// TestRefusedCopyOfUnconfirmedSubmission: a job submitted while the JOBS stream has no
// quorum is proposed by its leader and not confirmed; its next copies are refused while
// the first is uncommitted (wrong last sequence, code 10164), and the store does not
// hold the job yet. A store fault known meanwhile gives up the creates that were
// certainly not stored; but once a follower is back the first copy is committed. So
// the answer is "Outcome unknown" (or the job), never "not stored" for a job that is
// stored afterwards.
func TestRefusedCopyOfUnconfirmedSubmission(t *testing.T) {
	t.Parallel()
	cl, s := replicatedSystem(t, 30*time.Second)
	// A disk fault reported once a copy was refused as pending gives up at once the
	// creates known not to be stored (storage.go): it tells whether this one is.
	obs := &pendingObserver{}
	s.Config.Observer = obs
	s.Config.StoreFault = func() error {
		if obs.refused.Load() {
			return syscall.EROFS
		}
		return nil
	}
	s.StartCoordinator(t)
	s.StartNativeWorker(t)
	c := client.New(s.NC)
	ctx := context.Background()
	settledOnN0(t, cl, s.NC, c)

	records, err := storedRecords(s.NC)
	if err != nil {
		t.Fatal(err)
	}

	cl.Stop(t, 1)
	cl.Stop(t, 2)
	rctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	_, err = c.Submit(rctx, "SHA256", text("unconfirmed"))
	cancel()
	t.Logf("answered: %v", err)
	if !obs.refused.Load() {
		t.Fatal("no copy of the job was refused as pending")
	}
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Errorf("submission without a quorum: %v; want \"Outcome unknown\"", err)
	}

	// Node 0's log is ahead of node 1's: node 1 votes for it, and it commits the job.
	cl.Restart(t, 1)
	testkit.Wait(t, 90*time.Second, func() error {
		now, err := storedRecords(s.NC)
		if err == nil && len(now) != len(records)+1 {
			err = fmt.Errorf("%d records stored, want %d", len(now), len(records)+1)
		}
		return err
	})
	// The disk fault stays (new submissions are refused): the coordinator is only
	// checked not to have fenced itself.
	if err := s.Coordinator.FencedBy(); err != nil {
		t.Fatalf("the coordinator fenced itself once the quorum was back: %v", err)
	}
}

// storedRecords are the subjects of the JOBS stream's records (jobs, and the term),
// as its leader has them, and their message counts.
func storedRecords(nc *nats.Conn) (map[string]uint64, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, jobsStreamName)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("$KV."+protocol.JobsBucket+".*"))
	if err != nil {
		return nil, err
	}
	return info.State.Subjects, nil
}

// pendingObserver notes a job write refused because an earlier write of its subject
// is still being committed (JetStream's wrong last sequence without a sequence).
type pendingObserver struct{ refused atomic.Bool }

func (o *pendingObserver) Submitted(coordinator.SubmitOutcome) {}
func (o *pendingObserver) JobChanged(coordinator.JobChange)    {}
func (o *pendingObserver) DeadlineExpired(string)              {}
func (o *pendingObserver) Synced(time.Duration, int, error)    {}
func (o *pendingObserver) Stored(_ time.Duration, err error, _ bool, _ int) {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant {
		o.refused.Store(true)
	}
}

// TestUnconfirmedCancelIsOutcomeUnknown: a cancel written while the JOBS stream has no
// quorum is proposed by its leader and not confirmed; its next copy is refused while
// the first is uncommitted (wrong last sequence, code 10164), and the store still holds
// the job queued. Once a follower is back the first copy is committed: the job is
// cancelled. So the answer is "Outcome unknown" (or the cancel), never "not stored",
// and the coordinator, whose own write it was, does not take itself for fenced: not
// while the quorum is lost, nor when its next copy is refused because the first one
// landed, even if the record cannot be read back at once to tell (a replica that
// still takes the stream for leaderless answers "temporarily unavailable").
func TestUnconfirmedCancelIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	cl, s := replicatedSystem(t, 30*time.Second)
	obs := &pendingObserver{}
	s.Config.Observer = obs
	s.StartCoordinator(t)
	s.StartNativeWorker(t)
	c := client.New(s.NC)
	ctx := context.Background()
	var id string
	testkit.Wait(t, 60*time.Second, func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := c.SetQueue(rctx, "held", client.MaxRunning(1)); err != nil {
			return err
		}
		if _, err := c.PauseQueue(rctx, "held"); err != nil {
			return err
		}
		var err error
		id, err = c.Submit(rctx, "SHA256", text("held"), client.Queue("held"))
		return err
	})
	leadJobsStream(t, cl, s.NC, 0)

	cl.Stop(t, 1)
	cl.Stop(t, 2)
	rctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	_, _, err := c.Cancel(rctx, id)
	cancel()
	t.Logf("answered: %v", err)
	if err != nil && !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Errorf("cancel without a quorum: %v; want \"Outcome unknown\" or the cancel", err)
	}
	select {
	case <-s.Coordinator.Fenced():
		t.Error("the coordinator took its own unconfirmed write for another coordinator's")
	default:
	}
	if !obs.refused.Load() && !t.Failed() {
		t.Fatal("no copy of the cancel was refused as pending")
	}

	cl.Restart(t, 1)
	waitStoredAs(t, s.NC, id, protocol.StateCancelled)
	servesAfterQuorum(t, s, c)
}

// TestUnconfirmedWorkflowIsOutcomeUnknown: a workflow submitted while the JOBS stream
// has no quorum goes as one atomic batch, proposed by the stream's leader and not
// confirmed; the store does not hold it yet, but once a follower is back the batch is
// committed. So the answer is "Outcome unknown", never "not stored" for a workflow
// that is stored afterwards.
func TestUnconfirmedWorkflowIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	cl, s := replicatedSystem(t, 30*time.Second)
	s.StartCoordinator(t)
	s.StartNativeWorker(t)
	c := client.New(s.NC)
	ctx := context.Background()
	settledOnN0(t, cl, s.NC, c)

	cl.Stop(t, 1)
	cl.Stop(t, 2)
	w := client.NewWorkflow("wf-unconfirmed").
		Step("a", "SHA256", text("a")).
		Step("b", "SHA256", text("b"), client.StepAfter("a"))
	rctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	_, err := c.SubmitWorkflow(rctx, w)
	cancel()
	t.Logf("answered: %v", err)
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Errorf("workflow without a quorum: %v; want \"Outcome unknown\"", err)
	}

	// Node 0's log is ahead of node 1's: node 1 votes for it, and it commits the batch.
	cl.Restart(t, 1)
	subj := "$KV." + protocol.JobsBucket + "." + protocol.ControlPrefix + protocol.KindWorkflow + ".wf-unconfirmed"
	testkit.Wait(t, 90*time.Second, func() error {
		_, err := storedMessage(s.NC, subj)
		return err
	})
	servesAfterQuorum(t, s, c)
}

// TestResultOfferedAgainWhileUnconfirmed: a worker's result whose write the JOBS
// stream, without a quorum, does not confirm goes unanswered, and the worker offers it
// again, as it does every result until it is answered finally. The result is applied
// in memory, its write is not stored yet and may never be (the coordinator may be
// deposed, or stop, before a quorum is back): so the answer to the second offer must
// not be final, or the worker drops a result that nothing stored, and its job runs
// again, or FAILS on its last attempt. Once a follower is back the write is committed,
// and the result is answered.
func TestResultOfferedAgainWhileUnconfirmed(t *testing.T) {
	t.Parallel()
	cl, s := replicatedSystem(t, 30*time.Second)
	s.Config.HeartbeatTimeout = time.Hour // the raw worker does not beat
	s.Config.TaskTimeout = time.Hour
	s.StartCoordinator(t)
	c := client.New(s.NC)
	ctx := context.Background()
	w := newRawWorker(t, &system{System: s}, "w")
	testkit.Wait(t, 60*time.Second, func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := bus.Ask[protocol.WorkerRegistered](rctx, w.node, coordinatorAddr, protocol.PathRegister,
			&protocol.WorkerRegister{WorkerID: w.id, Capacity: 1, Instance: "p1"})
		return err
	})
	leadJobsStream(t, cl, s.NC, 0)
	var id string
	testkit.Wait(t, 60*time.Second, func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var err error
		id, err = c.Submit(rctx, "SHA256", text("x"), client.MaxAttempts(1))
		return err
	})
	a := w.nextAssign()
	if a.JobID != id {
		t.Fatalf("assigned %s, want %s", a.JobID, id)
	}

	cl.Stop(t, 1)
	cl.Stop(t, 2)
	res := suite.Result(w.id, a, true, "done")
	offer := func() (protocol.ResultAck, error) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return bus.Ask[protocol.ResultAck](rctx, w.node, coordinatorAddr, protocol.PathResult, res)
	}
	if ack, err := offer(); workerproto.Final(err) {
		t.Fatalf("first offer without a quorum answered finally: %+v, %v", ack, err)
	}
	ack, err := offer()
	t.Logf("offered again: %+v, %v", ack, err)
	if workerproto.Final(err) && !ack.Accepted {
		t.Errorf("the result offered again while its write is not stored was answered %+v, %v: final, not accepted, so the worker drops it", ack, err)
	}

	// Node 0's log is ahead of node 1's: node 1 votes for it, and it commits the result.
	cl.Restart(t, 1)
	waitStoredAs(t, s.NC, id, protocol.StateCompleted)
	// Stored: the worker's offers end.
	testkit.Wait(t, 30*time.Second, func() error {
		if ack, err := offer(); !workerproto.Final(err) {
			return fmt.Errorf("offered once stored: %+v, %w", ack, err)
		}
		return nil
	})
}

// TestUnconfirmedScheduleChangeIsFollowed: a schedule paused, another added and a
// third removed while the JOBS stream has no quorum are each answered "Outcome
// unknown"; once a follower is back the writes are committed, and the coordinator
// holds what is stored though nobody sent them again: the paused schedule is listed
// paused (it ticks no more), the added one is listed (it ticks), the removed one is
// not (it ticks no more).
func TestUnconfirmedScheduleChangeIsFollowed(t *testing.T) {
	t.Parallel()
	cl, s := replicatedSystem(t, 30*time.Second)
	s.StartCoordinator(t)
	s.StartNativeWorker(t)
	c := client.New(s.NC)
	ctx := context.Background()
	settledOnN0(t, cl, s.NC, c)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := c.AddSchedule(rctx, client.Schedule{Name: "daily", Cron: "@daily", TaskType: "SHA256", Payload: text("daily")})
	if err == nil {
		_, err = c.AddSchedule(rctx, client.Schedule{Name: "gone", Every: time.Hour, TaskType: "SHA256", Payload: text("gone")})
	}
	cancel()
	if err != nil {
		t.Fatal(err)
	}

	cl.Stop(t, 1)
	cl.Stop(t, 2)
	rctx, cancel = context.WithTimeout(ctx, 20*time.Second)
	_, err = c.PauseSchedule(rctx, "daily")
	cancel()
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("pause without a quorum: %v; want \"Outcome unknown\"", err)
	}
	rctx, cancel = context.WithTimeout(ctx, 20*time.Second)
	_, err = c.AddSchedule(rctx, client.Schedule{Name: "late", Every: time.Hour, TaskType: "SHA256", Payload: text("late")})
	cancel()
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("add without a quorum: %v; want \"Outcome unknown\"", err)
	}
	rctx, cancel = context.WithTimeout(ctx, 20*time.Second)
	_, err = c.RemoveSchedule(rctx, "gone")
	cancel()
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("rm without a quorum: %v; want \"Outcome unknown\"", err)
	}

	// Node 0's log is ahead of node 1's: node 1 votes for it, and it commits both.
	cl.Restart(t, 1)
	subj := "$KV." + protocol.JobsBucket + "." + protocol.ControlPrefix + protocol.SchedulePrefix
	testkit.Wait(t, 90*time.Second, func() error {
		if _, err := storedMessage(s.NC, subj+"late"); err != nil {
			return err
		}
		if data, err := storedMessage(s.NC, subj+"gone"); err != nil || len(data) > 0 {
			return fmt.Errorf("schedule gone stored as %q (%v); want its removal", data, err)
		}
		data, err := storedMessage(s.NC, subj+"daily")
		var sc protocol.Schedule
		if err == nil && (json.Unmarshal(data, &sc) != nil || !sc.Paused) {
			err = fmt.Errorf("schedule daily stored as %s", data)
		}
		return err
	})
	// Nobody sends them again: the coordinator reads them back and holds them.
	testkit.Wait(t, 60*time.Second, func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		scs, err := c.Schedules(rctx)
		if err != nil {
			return err
		}
		listed := make(map[string]protocol.Schedule)
		for _, sc := range scs {
			listed[sc.Name] = sc
		}
		_, late := listed["late"]
		_, gone := listed["gone"]
		if !listed["daily"].Paused || !late || gone {
			return fmt.Errorf("schedules listed: %+v; want daily paused, and late, not gone", scs)
		}
		return nil
	})
}

// unconfirmedWorkflow submits a workflow of two steps (b after a) while two of the
// three nodes of cl are stopped, wants "Outcome unknown", and restarts one: the JOBS
// stream's leader then commits the batch it proposed without a quorum. It returns once
// the workflow's record is stored, with the workflow and its coordinator's system.
// The submission waits wait, or the client's default with 0; meanwhile, if not nil,
// runs before the node is back.
func unconfirmedWorkflow(t *testing.T, id string, wait time.Duration, meanwhile func(*client.Client, *client.Workflow)) (*jobbustest.System, *client.Client, *client.Workflow) {
	t.Helper()
	cl, s := replicatedSystem(t, 60*time.Second)
	s.StartCoordinator(t)
	s.StartNativeWorker(t)
	c := client.New(s.NC)
	settledOnN0(t, cl, s.NC, c)

	cl.Stop(t, 1)
	cl.Stop(t, 2)
	w := client.NewWorkflow(id).
		Step("a", "SHA256", text("a")).
		Step("b", "SHA256", text("b"), client.StepAfter("a"))
	rctx, cancel := context.Background(), context.CancelFunc(func() {})
	if wait > 0 {
		rctx, cancel = context.WithTimeout(rctx, wait)
	}
	_, err := c.SubmitWorkflow(rctx, w)
	cancel()
	t.Logf("answered: %v", err)
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("workflow without a quorum: %v; want \"Outcome unknown\"", err)
	}
	if meanwhile != nil {
		meanwhile(c, w)
	}

	cl.Restart(t, 1)
	subj := "$KV." + protocol.JobsBucket + "." + protocol.ControlPrefix + protocol.KindWorkflow + "." + id
	testkit.Wait(t, 90*time.Second, func() error {
		_, err := storedMessage(s.NC, subj)
		return err
	})
	return s, c, w
}

// completedInOrder waits until workflow id COMPLETED, and checks that its step b
// waited for a.
func completedInOrder(t *testing.T, c *client.Client, id string) {
	t.Helper()
	var st protocol.WorkflowStatus
	testkit.Wait(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		if st, err = c.WorkflowStatus(ctx, id); err == nil && st.State != string(protocol.StateCompleted) {
			err = fmt.Errorf("workflow %s is %s: %+v", id, st.State, st.Steps)
		}
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := c.Status(ctx, st.Steps[1].JobID)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Parents) != 1 || b.Parents[0].JobID != st.Steps[0].JobID || b.Parents[0].State != protocol.StateCompleted {
		t.Errorf("step b's parents: %+v; want step a (%s), COMPLETED", b.Parents, st.Steps[0].JobID)
	}
}

// TestUnconfirmedWorkflowRunsOnceStored: a workflow answered "Outcome unknown" whose
// batch commits later (see TestUnconfirmedWorkflowIsOutcomeUnknown) is known to the
// coordinator that wrote it, without a restart or a resend: its status answers, and
// its jobs run, b after a.
func TestUnconfirmedWorkflowRunsOnceStored(t *testing.T) {
	t.Parallel()
	_, c, _ := unconfirmedWorkflow(t, "wf-runs", 8*time.Second, nil)
	completedInOrder(t, c, "wf-runs")
}

// TestUnconfirmedWorkflowSentAgain: a workflow answered "Outcome unknown", sent again
// as the answer advises, is answered "Outcome unknown" again while its batch is not
// committed; once it is, it is answered with the stored workflow (its jobs), never
// "already exists", and runs. Sent again with another definition, it is refused as
// one.
func TestUnconfirmedWorkflowSentAgain(t *testing.T) {
	t.Parallel()
	_, c, w := unconfirmedWorkflow(t, "wf-again", 8*time.Second, func(c *client.Client, w *client.Workflow) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.SubmitWorkflow(ctx, w)
		t.Logf("sent again without a quorum: %v", err)
		if !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Errorf("the same workflow sent again without a quorum: %v; want \"Outcome unknown\"", err)
		}
	})
	var sub protocol.WorkflowSubmitted
	testkit.Wait(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		sub, err = c.SubmitWorkflow(ctx, w)
		if err != nil && !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Fatalf("the same workflow sent again once stored: %v; want its jobs", err)
		}
		return err
	})
	if sub.WorkflowID != "wf-again" || len(sub.Jobs) != 2 || sub.Jobs["a"] == "" || sub.Jobs["b"] == "" {
		t.Fatalf("sent again: %+v; want workflow wf-again's two jobs", sub)
	}
	completedInOrder(t, c, "wf-again")

	other := client.NewWorkflow("wf-again").
		Step("a", "SHA256", text("another a")).
		Step("b", "SHA256", text("b"), client.StepAfter("a"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.SubmitWorkflow(ctx, other)
	if err == nil || errors.Is(err, client.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "another definition") {
		t.Errorf("another workflow under the same id: %v; want it refused as another definition", err)
	}
}

// TestUnconfirmedWorkflowAnsweredWithinItsWait: a workflow submitted while the JOBS
// stream has no quorum, by a client that waits its default (5 s), is answered
// "Outcome unknown" within that wait, as a job submission is, rather than left to time
// out (the write's own timeouts are longer); its batch commits later, and it runs.
func TestUnconfirmedWorkflowAnsweredWithinItsWait(t *testing.T) {
	t.Parallel()
	_, c, _ := unconfirmedWorkflow(t, "wf-in-time", 0, nil)
	completedInOrder(t, c, "wf-in-time")
}

// TestUnconfirmedWorkflowRetryRunsOnceStored: a workflow's retry answered "Outcome
// unknown" while the JOBS stream has no quorum, whose batch commits later, is known
// to the coordinator that wrote it: the failed step runs again as its new job, and
// the workflow can be retried again, rather than the coordinator holding the
// workflow as before the retry, whose control the store no longer has.
func TestUnconfirmedWorkflowRetryRunsOnceStored(t *testing.T) {
	t.Parallel()
	cl, s := replicatedSystem(t, 60*time.Second)
	s.StartCoordinator(t)
	s.StartNativeWorker(t)
	c := client.New(s.NC)
	settledOnN0(t, cl, s.NC, c)
	ctx := context.Background()

	w := client.NewWorkflow("wf-retry").
		Step("a", "FAIL", map[string]int{"failUntilAttempt": 5}, client.StepMaxAttempts(1)).
		Step("b", "SHA256", text("b"), client.StepAfter("a"))
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	sub, err := c.SubmitWorkflow(rctx, w)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	ended := func(want string) func() error {
		return func() error {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			st, err := c.WorkflowStatus(rctx, "wf-retry")
			if err == nil && (st.State != "FAILED" || st.Steps[0].JobID != want) {
				err = fmt.Errorf("workflow is %s, step a %s %s; want FAILED, step a %s", st.State, st.Steps[0].JobID, st.Steps[0].State, want)
			}
			return err
		}
	}
	testkit.Wait(t, 30*time.Second, ended(sub.Jobs["a"]))

	cl.Stop(t, 1)
	cl.Stop(t, 2)
	rctx, cancel = context.WithTimeout(ctx, 8*time.Second)
	_, err = c.RetryWorkflow(rctx, "wf-retry")
	cancel()
	t.Logf("retry answered: %v", err)
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("retry without a quorum: %v; want \"Outcome unknown\"", err)
	}
	cl.Restart(t, 1)

	// The retried step a is a new job (its id derived from its retry count); it
	// fails again, and b is cancelled after it again.
	var again string
	testkit.Wait(t, 90*time.Second, func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err := c.WorkflowStatus(rctx, "wf-retry")
		if err != nil {
			return err
		}
		if again = st.Steps[0].JobID; again == sub.Jobs["a"] {
			return fmt.Errorf("step a is still its first job %s (%s)", again, st.Steps[0].State)
		}
		return ended(again)()
	})
	rctx, cancel = context.WithTimeout(ctx, 8*time.Second)
	jobs, err := c.RetryWorkflow(rctx, "wf-retry")
	cancel()
	if err != nil || jobs["a"] == "" || jobs["a"] == again {
		t.Fatalf("retried again once the first retry was stored: %v %v; want step a run again as a new job", jobs, err)
	}
}

// replicatedSystem is a system on node 0 of a new three-node cluster, its JOBS stream
// replicated three times, its coordinator's leader lease lease (outlasting what the
// test waits for, so that the answers are the store's, not "not serving"). The caller
// configures the rest, then starts it.
func replicatedSystem(t *testing.T, lease time.Duration) (*jobbustest.Cluster, *jobbustest.System) {
	t.Helper()
	cl := jobbustest.StartRestartableCluster(t, 3)
	s := &jobbustest.System{Server: cl.Nodes[0], NC: dialServer(t, cl.Nodes[0].ClientURL()), Config: jobbustest.FastCoordinatorConfig()}
	s.Config.Replicas = 3
	s.Config.LeaderLease = lease
	return cl, s
}

// waitStoredAs waits until the JOBS stream's leader holds job id in state.
func waitStoredAs(t *testing.T, nc *nats.Conn, id string, state protocol.State) {
	t.Helper()
	testkit.Wait(t, 90*time.Second, func() error {
		data, err := storedMessage(nc, "$KV."+protocol.JobsBucket+"."+id)
		if err != nil {
			return err
		}
		var j protocol.Job
		if err := json.Unmarshal(data, &j); err != nil || j.State != state {
			return fmt.Errorf("job %s stored as %s", id, data)
		}
		return nil
	})
}

// TestUnconfirmedSettingSentAgain: a setting's write answered "Outcome unknown" (the
// JOBS stream lost its quorum) waits in the stream leader's log, and meanwhile the
// leader refuses another write of that key checked against its revision ("wrong last
// sequence", code 10164), though the store does not hold the first yet. The answer
// said sending the command again is safe: sent again, a schedule's add and a queue's
// pause are answered as the first was, "Outcome unknown", never as a name in use or a
// setting changed meanwhile. Once a node is back both are stored, and sent once more
// answered as done.
func TestUnconfirmedSettingSentAgain(t *testing.T) {
	t.Parallel()
	cl, s := replicatedSystem(t, 60*time.Second)
	s.StartCoordinator(t)
	s.StartNativeWorker(t)
	c := client.New(s.NC)
	ctx := context.Background()
	testkit.Wait(t, 60*time.Second, func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.SetQueue(rctx, "q", client.MaxRunning(1))
		return err
	})
	settledOnN0(t, cl, s.NC, c)
	sched := client.Schedule{Name: "nightly", Every: time.Hour, TaskType: "SHA256", Payload: text("tick")}

	cl.Stop(t, 1)
	cl.Stop(t, 2)
	for _, tc := range []struct {
		name string
		send func(ctx context.Context) error
	}{
		{"schedule add", func(ctx context.Context) error { _, err := c.AddSchedule(ctx, sched); return err }},
		{"queue pause", func(ctx context.Context) error { _, err := c.PauseQueue(ctx, "q"); return err }},
	} {
		for send := 1; send <= 2; send++ {
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			err := tc.send(rctx)
			cancel()
			if !errors.Is(err, client.ErrOutcomeUnknown) {
				t.Errorf("%s without a quorum, send %d: %v; want \"Outcome unknown\"", tc.name, send, err)
			}
			t.Logf("%s, send %d: %v", tc.name, send, err)
		}
	}

	cl.Restart(t, 1)
	testkit.Wait(t, 90*time.Second, func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := c.AddSchedule(rctx, sched); err != nil {
			return err
		}
		q, err := c.PauseQueue(rctx, "q")
		if err == nil && !q.Paused {
			err = errors.New("queue q not paused")
		}
		return err
	})
	servesAfterQuorum(t, s, c)
}
