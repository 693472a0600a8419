package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest/suite"
)

// TestFencedByForeignWrite shows invariant 3: when someone else writes a job record the
// coordinator believes it owns, the coordinator's next write of it fails its CAS, the
// foreign record survives, and the coordinator stops changing state.
func TestFencedByForeignWrite(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	m := s.ManualWorker("w", 1)
	id := s.Submit("SHA256", text("x"))
	a := s.NextAssign(m)

	kv, foreign := cancelBehindItsBack(t, s, id)

	// The coordinator's write of COMPLETED must fail, and the result not be acknowledged.
	ack, err := bus.Ask[protocol.ResultAck](ctx, m.(*suite.BusPeer).Node(), coordinatorAddr, protocol.PathResult, suite.Result("w", a, true, "mine"))
	if err == nil && ack.Accepted {
		t.Fatal("a result was acknowledged although its write could not be stored")
	}
	after, err := kv.Get(ctx, id)
	must(t, err)
	if string(after.Value()) != foreign {
		t.Fatalf("the foreign write was overwritten:\n%s", after.Value())
	}
	// It no longer serves: requests get its refusal or, once its service is withdrawn, no answer.
	s.Eventually("the fenced coordinator withdrawn", func() bool {
		_, err := s.Client.Submit(ctx, "SHA256", text("y"))
		return errors.Is(err, client.ErrNoCoordinator)
	})
	// The service's endpoints go one by one; none answers with the state it never stored.
	if j, err := s.Client.Status(ctx, id); !errors.Is(err, client.ErrNoCoordinator) && !strings.Contains(fmt.Sprint(err), "not serving") {
		t.Fatalf("status from a fenced coordinator: %+v %v", j, err)
	}
}

// cancelBehindItsBack waits for job id's RUNNING record and rewrites it CANCELLED in
// KV, as another coordinator would, returning the bucket and the record written.
func cancelBehindItsBack(t *testing.T, s *system, id string) (jetstream.KeyValue, string) {
	t.Helper()
	ctx := context.Background()
	js, err := jetstream.New(s.NC)
	must(t, err)
	kv, err := js.KeyValue(ctx, protocol.JobsBucket)
	must(t, err)
	var entry jetstream.KeyValueEntry
	s.Eventually("the RUNNING record stored", func() bool {
		entry, err = kv.Get(ctx, id)
		return err == nil && strings.Contains(string(entry.Value()), `"state":"RUNNING"`)
	})
	foreign := strings.Replace(string(entry.Value()), `"state":"RUNNING"`, `"state":"CANCELLED"`, 1)
	_, err = kv.Update(ctx, id, []byte(foreign), entry.Revision())
	must(t, err)
	return kv, foreign
}

// TestDeposedLeaderCannotCreate: once another coordinator has claimed a newer term, an
// old one (paused, say, and not yet aware) can store no new job and bind no key: its
// submitters get an error, never JOB_SUBMITTED, and it stops. The next leader finds
// nothing it created.
func TestDeposedLeaderCannotCreate(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	old := s.Coordinator
	before := s.Submit("SHA256", text("before the new term"))

	// A newer leader claims its term, then goes quiet: only the old one serves.
	newer, err := coordinator.New(s.NC, s.Config)
	must(t, err)
	must(t, newer.Start(ctx))
	if newer.Term() != old.Term()+1 {
		t.Fatalf("terms %d then %d", old.Term(), newer.Term())
	}
	must(t, newer.Close())

	for _, key := range []string{"", "deposed-key"} {
		var opts []client.SubmitOption
		if key != "" {
			opts = append(opts, client.IdempotencyKey(key))
		}
		id, err := s.Client.Submit(ctx, "SHA256", text("after"), opts...)
		if err == nil {
			t.Fatalf("a deposed leader accepted job %s", id)
		}
		if !strings.Contains(err.Error(), "term") && !errors.Is(err, client.ErrNoCoordinator) {
			t.Fatalf("submit to a deposed leader: %v", err)
		}
	}
	select {
	case <-old.Fenced():
	default:
		t.Fatal("the deposed leader goes on serving")
	}

	s.RestartCoordinator(t)
	list, err := s.Client.List(ctx, protocol.ListJobs{})
	must(t, err)
	if len(list.Jobs) != 1 || list.Jobs[0].JobID != before {
		t.Fatalf("jobs after the deposed leader's submissions: %+v, want only %s", list.Jobs, before)
	}
	id, err := s.Client.Submit(ctx, "SHA256", text("other"), client.IdempotencyKey("deposed-key"))
	must(t, err)
	if id == before {
		t.Fatal("the key was bound by the deposed leader")
	}
}

// TestLapsedLeaseAnswersNothing: a leader whose lease may have run out by its own clock
// answers every request with 503 (the caller tries again, reaching whoever leads),
// results included, and serves again once the lease is renewed.
func TestLapsedLeaseAnswersNothing(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	m := s.ManualWorker("w", 1)
	id := s.Submit("SHA256", text("x"))
	a := s.NextAssign(m)
	c := s.Coordinator

	c.RenewedLease(time.Now().Add(-time.Minute), time.Second)
	if _, err := s.Client.Status(ctx, id); err == nil || !strings.Contains(err.Error(), "lease may have run out") {
		t.Fatalf("status with a lapsed lease: %v", err)
	}
	for _, attempt := range []string{a.AttemptID, "granted-by-a-newer-leader"} {
		r := suite.Result("w", a, true, "done")
		r.AttemptID = attempt
		ack, err := bus.Ask[protocol.ResultAck](ctx, m.(*suite.BusPeer).Node(), coordinatorAddr, protocol.PathResult, r)
		if !errors.Is(err, bus.CodeUnavailable) {
			t.Fatalf("result for attempt %s with a lapsed lease: %+v %v, want 503", attempt, ack, err)
		}
	}

	c.RenewedLease(time.Now(), time.Minute)
	ack, err := bus.Ask[protocol.ResultAck](ctx, m.(*suite.BusPeer).Node(), coordinatorAddr, protocol.PathResult, suite.Result("w", a, true, "done"))
	must(t, err)
	if !ack.Accepted {
		t.Fatal("result refused once the lease was renewed")
	}
	if j := s.Wait(id); j.State != protocol.StateCompleted {
		t.Fatalf("job %+v", j)
	}
}
