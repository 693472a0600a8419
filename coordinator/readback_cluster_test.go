package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
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

// TestUnconfirmedSettingIsOutcomeUnknown: a queue setting written while the JOBS
// stream has no quorum is proposed by its leader and not confirmed. The leader's store
// does not hold it yet, so a read-back finds the old setting; but the proposal is in
// the leader's log, and once a follower is back it is committed. So the answer is
// "Outcome unknown", never "settings not stored" for a setting that is stored
// afterwards.
func TestUnconfirmedSettingIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	cl := jobbustest.StartRestartableCluster(t, 3)
	s := &jobbustest.System{Server: cl.Nodes[0], NC: dialServer(t, cl.Nodes[0].ClientURL()), Config: jobbustest.FastCoordinatorConfig()}
	s.Config.Replicas = 3
	s.Config.LeaderLease = 10 * time.Second // outlasts the write: the answer is the store's, not "not serving"
	s.StartCoordinator(t)
	c := client.New(s.NC)
	ctx := context.Background()
	testkit.Wait(t, 60*time.Second, func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.SetQueue(rctx, "q", client.MaxRunning(1))
		return err
	})
	leadJobsStream(t, cl, s.NC, 0)

	cl.Stop(t, 1)
	cl.Stop(t, 2)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := c.PauseQueue(rctx, "q")
	cancel()
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("pause without a quorum: %v; want \"Outcome unknown\"", err)
	}
	t.Logf("answered: %v", err)

	// Node 0's log is ahead of node 1's: node 1 votes for it, and it commits the pause.
	cl.Restart(t, 1)
	subj := "$KV." + protocol.JobsBucket + "." + protocol.ControlPrefix + protocol.QueueControlPrefix + "q"
	testkit.Wait(t, 90*time.Second, func() error {
		m, err := s.NC.Request("$JS.API.STREAM.MSG.GET."+jobsStreamName, []byte(`{"last_by_subj":"`+subj+`"}`), 5*time.Second)
		if err != nil {
			return err
		}
		var resp struct {
			Message *struct {
				Data []byte `json:"data"`
			} `json:"message"`
		}
		if err := json.Unmarshal(m.Data, &resp); err != nil || resp.Message == nil {
			return fmt.Errorf("read %s: %q, %v", subj, m.Data, err)
		}
		var st protocol.QueueSettings
		if err := json.Unmarshal(resp.Message.Data, &st); err != nil || !st.Paused {
			return fmt.Errorf("queue q stored as %s", resp.Message.Data)
		}
		return nil
	})
}
