package cli_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// TestWorkflowSurvivesLeaderSIGKILL is issue 26's failover measure with real
// processes: two coordinators (lease 2 s) and a worker process; a 1,000-step workflow
// (10 layers of 100, each step after two of the layer before) runs, and the leading
// coordinator is SIGKILLed once a third of it completed. The standby takes over and
// the workflow ends COMPLETED: every step stored once, COMPLETED, and run again only
// if it was running at the kill (at-least-once).
func TestWorkflowSurvivesLeaderSIGKILL(t *testing.T) {
	t.Parallel()
	s := startNATS(t)
	coordinator := func() *proc {
		return startProc(t, nil, "--nats", s.url, "coordinator", "--http-listen", "-", "--leader-lease-millis", "2000")
	}
	leader := coordinator()
	leader.logged(`msg="coordinator serving"`)
	standby := coordinator()
	standby.logged(`msg="standing by`)
	const capacity = 32
	startProc(t, nil, "--nats", s.url, "worker", "--capacity", fmt.Sprint(capacity), "--heartbeat-interval-millis", "200")

	const layers, width = 10, 100
	rng := rand.New(rand.NewPCG(26, 26))
	w := client.NewWorkflow("big")
	for l := range layers {
		for i := range width {
			var opts []client.StepOption
			if l > 0 {
				a, b := rng.IntN(width), rng.IntN(width)
				if b == a {
					b = (a + 1) % width
				}
				opts = append(opts, client.StepAfter(fmt.Sprintf("s%d-%d", l-1, a), fmt.Sprintf("s%d-%d", l-1, b)))
			}
			w.Step(fmt.Sprintf("s%d-%d", l, i), "SLEEP", map[string]int{"durationMillis": 40}, opts...)
		}
	}
	cl := client.New(s.NC, client.WithTimeout(30*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var sub protocol.WorkflowSubmitted
	var err error
	eventually(t, "the workflow submitted", func() bool {
		sub, err = cl.SubmitWorkflow(ctx, w)
		return err == nil
	})
	eventually(t, "a third of the workflow completed", func() bool {
		st, err := cl.WorkflowStatus(ctx, "big")
		return err == nil && st.Counts[protocol.StateCompleted] >= layers*width/3
	})
	before, _ := cl.WorkflowStatus(ctx, "big")
	killed := time.Now()
	leader.signal(syscall.SIGKILL)
	served := servingSince(t, standby, killed)
	st, err := cl.WaitWorkflow(ctx, "big")
	if err != nil {
		t.Fatalf("wait for the workflow after the failover: %v", err)
	}
	ended := time.Now()
	if st.State != "COMPLETED" || st.Counts[protocol.StateCompleted] != layers*width {
		t.Fatalf("workflow after the leader's SIGKILL: %s %v, want all %d COMPLETED", st.State, st.Counts, layers*width)
	}
	recs := storedRecords(t, s.NC)
	steps, extra := 0, 0
	for _, r := range recs {
		if r.WorkflowID != "big" {
			continue
		}
		steps++
		if r.State != protocol.StateCompleted {
			t.Errorf("step %s stored %s", r.Step, r.State)
		}
		if want := sub.Jobs[r.Step]; want != r.JobID {
			t.Errorf("step %s stored as job %s, submitted as %s", r.Step, r.JobID, want)
		}
		extra += r.Attempts - 1
	}
	if steps != layers*width {
		t.Errorf("the store holds %d steps, want %d", steps, layers*width)
	}
	if extra > capacity {
		t.Errorf("%d attempts beyond one per step, more than the %d that could run at the kill", extra, capacity)
	}
	t.Logf("SIGKILL at %d/%d steps COMPLETED (%d RUNNING); standby serving after %v; workflow COMPLETED %v after the kill; %d steps ran twice",
		before.Counts[protocol.StateCompleted], layers*width, before.Counts[protocol.StateRunning], served.Sub(killed).Round(time.Millisecond),
		ended.Sub(killed).Round(time.Millisecond), extra)
}
