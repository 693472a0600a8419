package coordinator_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestUnconfirmedSubmissionIsOutcomeUnknown: in a three-node cluster whose JOBS stream
// lost its quorum (two nodes stopped), no write can be confirmed. A submission is then
// answered within the time its sender waits (Jobbus-Timeout-Millis) with "Outcome
// unknown" naming its job, over NATS and over the bridge's TCP port alike: never with an
// ERROR that would mean nothing was stored, and never a diagnosis of a disk. Its write
// goes on, so once the nodes are back the job named is stored and runs.
func TestUnconfirmedSubmissionIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	cl := jobbustest.StartRestartableCluster(t, 3)
	s := &jobbustest.System{Server: cl.Nodes[0], NC: dialServer(t, cl.Nodes[0].ClientURL()), Config: jobbustest.FastCoordinatorConfig()}
	s.Config.Replicas = 3
	s.StartCoordinator(t)
	w, _ := s.StartNativeWorker(t)
	const wait = 2 * time.Second
	br := s.StartBridge(t, func(c *bridge.Config) { c.RequestTimeout = wait }) // as a spec client waits longer
	native := client.New(s.NC)
	testkit.Wait(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		id, err := native.Submit(ctx, "SHA256", text("before"))
		if err == nil {
			_, err = native.Wait(ctx, id)
		}
		if err == nil && !jobbustest.WorkerListed(native, w.ID()) {
			err = errors.New("worker not listed")
		}
		return err
	})
	ctx := context.Background()
	tcp, err := client.DialTCP(ctx, br.ClientAddr().String())
	must(t, err)
	t.Cleanup(func() { _ = tcp.Close() })

	cl.Stop(t, 1)
	cl.Stop(t, 2)
	var ids []string
	for _, tc := range []struct {
		name string
		c    *client.Client
	}{{"NATS", native}, {"TCP", tcp}} {
		// The native client says how long it waits; the bridge says its own wait.
		rctx, cancel := context.WithTimeout(ctx, wait+100*time.Millisecond)
		start := time.Now()
		_, err := tc.c.Submit(rctx, "SHA256", text("unconfirmed "+tc.name))
		took := time.Since(start)
		cancel()
		id, named := client.OutcomeJob(err)
		if !errors.Is(err, client.ErrOutcomeUnknown) || !named {
			t.Fatalf("%s: submit without a quorum: %v; want \"Outcome unknown\" naming the job", tc.name, err)
		}
		if took >= wait+100*time.Millisecond {
			t.Errorf("%s: answered after %v, not within the %v the request waits", tc.name, took, wait)
		}
		if strings.Contains(err.Error(), "disk") {
			t.Errorf("%s: a lost quorum blamed on a disk: %v", tc.name, err)
		}
		t.Logf("%s: answered in %v: %v", tc.name, took.Round(time.Millisecond), err)
		ids = append(ids, id)
	}

	cl.Restart(t, 1)
	cl.Restart(t, 2)
	for _, id := range ids {
		testkit.Wait(t, 90*time.Second, func() error {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			j, err := native.Status(rctx, id)
			if err == nil && j.State != protocol.StateCompleted {
				err = errors.New("job " + id + " is " + string(j.State))
			}
			return err
		})
	}
}
