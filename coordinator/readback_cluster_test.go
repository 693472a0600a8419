package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	cl := jobbustest.StartRestartableCluster(t, 3)
	s := &jobbustest.System{Server: cl.Nodes[0], NC: dialServer(t, cl.Nodes[0].ClientURL()), Config: jobbustest.FastCoordinatorConfig()}
	s.Config.Replicas = 3
	s.Config.LeaderLease = 10 * time.Second // outlasts the write: the answer is the store's, not "not serving"
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
	cl := jobbustest.StartRestartableCluster(t, 3)
	s := &jobbustest.System{Server: cl.Nodes[0], NC: dialServer(t, cl.Nodes[0].ClientURL()), Config: jobbustest.FastCoordinatorConfig()}
	s.Config.Replicas = 3
	s.Config.LeaderLease = 30 * time.Second // outlasts the test: the answer is the store's
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
	cl := jobbustest.StartRestartableCluster(t, 3)
	s := &jobbustest.System{Server: cl.Nodes[0], NC: dialServer(t, cl.Nodes[0].ClientURL()), Config: jobbustest.FastCoordinatorConfig()}
	s.Config.Replicas = 3
	s.Config.LeaderLease = 30 * time.Second // outlasts the test: the answer is the store's
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
	testkit.Wait(t, 90*time.Second, func() error {
		data, err := storedMessage(s.NC, "$KV."+protocol.JobsBucket+"."+id)
		if err != nil {
			return err
		}
		var j protocol.Job
		if err := json.Unmarshal(data, &j); err != nil || j.State != protocol.StateCancelled {
			return fmt.Errorf("job %s stored as %s", id, data)
		}
		return nil
	})
	servesAfterQuorum(t, s, c)
}

// TestUnconfirmedWorkflowIsOutcomeUnknown: a workflow submitted while the JOBS stream
// has no quorum goes as one atomic batch, proposed by the stream's leader and not
// confirmed; the store does not hold it yet, but once a follower is back the batch is
// committed. So the answer is "Outcome unknown", never "not stored" for a workflow
// that is stored afterwards.
func TestUnconfirmedWorkflowIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	cl := jobbustest.StartRestartableCluster(t, 3)
	s := &jobbustest.System{Server: cl.Nodes[0], NC: dialServer(t, cl.Nodes[0].ClientURL()), Config: jobbustest.FastCoordinatorConfig()}
	s.Config.Replicas = 3
	s.Config.LeaderLease = 30 * time.Second // outlasts the test: the answer is the store's
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
	cl := jobbustest.StartRestartableCluster(t, 3)
	s := &jobbustest.System{Server: cl.Nodes[0], NC: dialServer(t, cl.Nodes[0].ClientURL()), Config: jobbustest.FastCoordinatorConfig()}
	s.Config.Replicas = 3
	s.Config.LeaderLease = 30 * time.Second // outlasts the test: the answers are the store's
	s.Config.HeartbeatTimeout = time.Hour   // the raw worker does not beat
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
	testkit.Wait(t, 90*time.Second, func() error {
		data, err := storedMessage(s.NC, "$KV."+protocol.JobsBucket+"."+id)
		if err != nil {
			return err
		}
		var j protocol.Job
		if err := json.Unmarshal(data, &j); err != nil || j.State != protocol.StateCompleted {
			return fmt.Errorf("job %s stored as %s", id, data)
		}
		return nil
	})
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
	cl := jobbustest.StartRestartableCluster(t, 3)
	s := &jobbustest.System{Server: cl.Nodes[0], NC: dialServer(t, cl.Nodes[0].ClientURL()), Config: jobbustest.FastCoordinatorConfig()}
	s.Config.Replicas = 3
	s.Config.LeaderLease = 30 * time.Second // outlasts the test: the answer is the store's
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
