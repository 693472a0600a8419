package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
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
