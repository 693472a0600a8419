package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestNATSOutageCostsNoAttempts is issue 9's "a short outage must not cost attempts"
// with real processes: a native worker runs jobs that have one attempt each and
// outlast the outage; the external nats-server is SIGKILLed for several heartbeat
// timeouts and comes back on the same store. Every job completes on its one attempt:
// the worker's connection came back, it heartbeated instead of registering again, and
// its attempts went on.
//
// The outage (4 s) is more than two heartbeat timeouts and two leases: with one
// coordinator, nobody else can take the lease meanwhile. The coordinator must not
// count the outage as the workers' silence, in two regimes: a heartbeat timeout longer
// than what is left of the lease when NATS goes (the lease clock pauses the sweeper
// before any worker could time out), and one shorter (the sweeper sees its own
// connection down, and gives grace when it returns). A spec TCP worker behind
// `jobbus bridge` keeps its attempts the same way: the bridge never registered again on
// a reconnect, and its heartbeats for the worker resume.
func TestNATSOutageCostsNoAttempts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                       string
		leaseMillis, timeoutMillis int
		tcp                        bool
	}{
		{"TimeoutBeyondLease", 1000, 1500, false},
		{"TimeoutWithinLease", 2000, 800, false},
		{"TCPWorkerBehindBridge", 2000, 800, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testOutageCostsNoAttempts(t, tc.leaseMillis, tc.timeoutMillis, tc.tcp)
		})
	}
}

func testOutageCostsNoAttempts(t *testing.T, leaseMillis, timeoutMillis int, tcp bool) {
	const jobs, sleepMillis = 4, 10_000
	ports := freePorts(t, 3)
	port := ports[0]
	dir := t.TempDir()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	server := natsServer(t, port, dir)
	nc := reconnecting(t, url)
	coord := startProc(t, nil, "--nats", url, "coordinator", "--http-listen", "-",
		"--leader-lease-millis", fmt.Sprint(leaseMillis), "--heartbeat-timeout-millis", fmt.Sprint(timeoutMillis), "--sweep-interval-millis", "50")
	coord.logged(`msg="coordinator serving"`)
	workerArgs := []string{"worker", "--id", "w1", "--capacity", fmt.Sprint(jobs), "--heartbeat-interval-millis", "100"}
	if tcp {
		startProc(t, nil, "--nats", url, "bridge", "--worker-port", fmt.Sprint(ports[1]), "--client-port", fmt.Sprint(ports[2]))
		workerArgs = append(workerArgs, "--connect", hostPort(ports[1]), "--reconnect-delay-millis", "50")
	} else {
		workerArgs = append([]string{"--nats", url}, workerArgs...)
	}
	wp := startProc(t, nil, workerArgs...)
	cl := client.New(nc)
	eventually(t, "worker listed", func() bool {
		ws, err := cl.Workers(context.Background())
		return err == nil && len(ws) == 1
	})
	ids := make([]string, jobs)
	for i := range ids {
		id, err := cl.Submit(context.Background(), "SLEEP", json.RawMessage(fmt.Sprintf(`{"durationMillis":%d}`, sleepMillis)), client.MaxAttempts(1))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	for _, id := range ids {
		eventually(t, "job "+id+" running", func() bool {
			j, err := cl.Status(context.Background(), id)
			return err == nil && j.State == protocol.StateRunning
		})
	}

	if err := server.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second) // the outage itself, not a wait for anything
	natsServer(t, port, dir)

	for _, id := range ids {
		var j protocol.Job
		testkit.Eventually(t, 30*time.Second, "job "+id+" finished", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var err error
			j, err = cl.Status(ctx, id)
			return err == nil && j.State.Terminal()
		})
		if j.State != protocol.StateCompleted || j.Attempts != 1 || j.Error != nil {
			t.Errorf("job %s: %s after %d attempts, error %q: want COMPLETED on its one attempt", id, j.State, j.Attempts, deref(j.Error))
		}
	}
	if m := regexp.MustCompile(`abandoned=[1-9]`).FindString(wp.stderr.String()); m != "" {
		t.Errorf("the worker abandoned attempts (%s)", m)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
