package cli_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/worker"
)

// TestPausedLeaderLosesNothing is DESIGN invariant 3 with real processes: the leading
// coordinator is stopped (SIGSTOP: a GC pause, a stalled VM) past its lease under a
// stream of submissions, the standby takes over, and the old leader is let go on
// (SIGCONT) with its backlog. Every submission answered JOB_SUBMITTED completes; none
// is left RUNNING or unknown.
func TestPausedLeaderLosesNothing(t *testing.T) {
	t.Parallel()
	s := startNATS(t)
	leader, standby := s.leaderAndStandby("--leader-lease-millis", "600", "--heartbeat-timeout-millis", "3000")
	s.StartNativeWorker(t, worker.WithCapacity(16))

	cl := client.New(s.NC)
	var (
		mu       sync.Mutex
		accepted []string
		refused  int
	)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				rctx, cancel := context.WithTimeout(ctx, time.Second)
				id, err := cl.Submit(rctx, "SHA256", map[string]string{"text": fmt.Sprint(i)})
				cancel()
				mu.Lock()
				if err == nil {
					accepted = append(accepted, id)
				} else if !errors.Is(err, context.Canceled) {
					refused++
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // submissions before the pause
	leader.signal(syscall.SIGSTOP)
	standby.logged(`msg="coordinator serving"`)
	time.Sleep(500 * time.Millisecond) // submissions to the new leader, while the old is stopped
	leader.signal(syscall.SIGCONT)
	time.Sleep(time.Second) // the old leader works through its backlog
	stop()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(accepted) == 0 {
		t.Fatal("no submission accepted")
	}
	for _, id := range accepted {
		var j protocol.Job
		eventually(t, "job "+id+" completed", func() bool {
			var err error
			j, err = cl.Status(context.Background(), id)
			return err == nil && j.State == protocol.StateCompleted
		})
	}
	t.Logf("%d submissions accepted and completed, %d refused or unanswered around the pause", len(accepted), refused)
}

// leaderAndStandby runs two `jobbus coordinator` processes with args on s, and returns
// them once the first leads and the second stands by.
func (s *system) leaderAndStandby(args ...string) (leader, standby *proc) {
	s.t.Helper()
	coordinator := func() *proc {
		return startProc(s.t, nil, append([]string{"--nats", s.url, "coordinator", "--http-listen", "-"}, args...)...)
	}
	leader = coordinator()
	leader.logged(`msg="coordinator serving"`)
	standby = coordinator()
	standby.logged(`msg="standing by`)
	return leader, standby
}
