package cli_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker/tcpworker"
)

// TestKillsLoseNothing is issue 9's fault table as a test: while four clients submit
// steadily (a third of the jobs sleep 300 ms, so that kills find attempts running), jobbus serve is SIGKILLed and started again on its store, jobbus worker
// processes are SIGKILLed and replaced, and spec TCP workers' sockets are reset or
// closed under them (they dial again). Every job that got JOB_SUBMITTED completes, and
// the re-runs (attempts beyond a job's first) stay within what the kills could cost:
// the capacity each kill took down. JOBBUS_LONG_TESTS=1 (task test-chaos) runs the
// long variant.
func TestKillsLoseNothing(t *testing.T) {
	t.Parallel()
	rounds, extra := 1, 0
	if os.Getenv("JOBBUS_LONG_TESTS") != "" {
		rounds, extra = 6, 4
	}
	c := startChaos(t)
	c.waitForWorkers()
	stop := c.submit(4)
	// Each round: a worker process killed, a TCP socket reset, serve killed, a TCP
	// socket closed, a worker process killed, and 4 more worker kills in long runs.
	for range rounds {
		c.pause()
		c.killWorkerProcess()
		c.pause()
		c.cutTCP(true)
		c.pause()
		c.killServe()
		c.pause()
		c.cutTCP(false)
		c.pause()
		c.killWorkerProcess()
		for range extra {
			c.pause()
			c.killWorkerProcess()
		}
	}
	c.pause()
	accepted := stop()
	c.verify(accepted)
}

// chaos is a jobbus serve process with two worker processes and two spec TCP workers,
// and what has been done to them.
type chaos struct {
	t                        *testing.T
	dir                      string
	natsPort, workerPort     int
	serve                    *proc
	workers                  []*proc
	tcp                      *tcpConns
	serveKills, workerKills  int
	tcpCuts, capacityKilled  int
	natsURL                  string
	nextWorker               int
	workerCapacity, tcpCount int
}

func startChaos(t *testing.T) *chaos {
	ports := freePorts(t, 2)
	c := &chaos{t: t, dir: t.TempDir(), natsPort: ports[0], workerPort: ports[1], tcp: &tcpConns{},
		workerCapacity: 4, tcpCount: 2}
	c.natsURL = "nats://" + hostPort(c.natsPort)
	c.startServe()
	for range 2 {
		c.startWorker()
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for i := range c.tcpCount {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A registration refused ends Run, as the spec's worker gives up on an
			// ERROR (the bridge waits its request timeout for a coordinator first,
			// which a slow restart under -race may exceed); a new worker tries again.
			for ctx.Err() == nil {
				w, err := tcpworker.New(hostPort(c.workerPort), tcpworker.WithID("tcp-"+strconv.Itoa(i)),
					tcpworker.WithCapacity(c.workerCapacity), tcpworker.WithHeartbeat(200*time.Millisecond),
					tcpworker.WithReconnectDelay(50*time.Millisecond), tcpworker.WithLogger(nil), tcpworker.WithDialer(c.tcp.dial))
				if err != nil {
					t.Error(err)
					return
				}
				if err := w.Run(ctx); err != nil && ctx.Err() == nil {
					t.Logf("TCP worker tcp-%d: %v; starting another", i, err)
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	return c
}

// waitForWorkers waits until serve lists every worker.
func (c *chaos) waitForWorkers() {
	nc, err := nats.Connect(c.natsURL, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	cl := client.New(nc)
	testkit.Eventually(c.t, 30*time.Second, "serve to list 4 workers", func() bool {
		ws, err := cl.Workers(context.Background())
		return err == nil && len(ws) == len(c.workers)+c.tcpCount
	})
}

func (c *chaos) startServe() {
	c.serve = startProc(c.t, nil, "serve", "--data-dir", c.dir, "--nats-listen", hostPort(c.natsPort),
		"--worker-port", strconv.Itoa(c.workerPort), "--client-port", "0", "--http-listen", "-",
		"--sweep-interval-millis", "20", "--log-level", "warn")
}

func (c *chaos) startWorker() {
	c.nextWorker++
	c.workers = append(c.workers, startProc(c.t, nil, "--nats", c.natsURL, "worker",
		"--id", "proc-"+strconv.Itoa(c.nextWorker), "--capacity", strconv.Itoa(c.workerCapacity)))
}

// pause lets the system run a moment between two faults.
func (c *chaos) pause() { time.Sleep(700 * time.Millisecond) }

func (c *chaos) killServe() {
	c.serve.signal(syscall.SIGKILL)
	<-c.serve.done
	c.serveKills++
	c.capacityKilled += c.workerCapacity * (len(c.workers) + c.tcpCount) // every running attempt's outcome is unknown
	c.startServe()
}

func (c *chaos) killWorkerProcess() {
	w := c.workers[0]
	w.signal(syscall.SIGKILL)
	<-w.done
	c.workers = c.workers[1:]
	c.workerKills++
	c.capacityKilled += c.workerCapacity
	c.startWorker()
}

// cutTCP ends one TCP worker's connection: reset (RST) or closed (FIN).
func (c *chaos) cutTCP(reset bool) {
	if c.tcp.cut(reset) {
		c.tcpCuts++
		c.capacityKilled += c.workerCapacity
	}
}

// submit starts n clients submitting until the function it returns is called, which
// returns the ids of the jobs that got JOB_SUBMITTED. A submission that fails (serve
// is down, or restarting) is tried again a moment later.
func (c *chaos) submit(n int) (stop func() []string) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu       sync.Mutex
		accepted []string
		wg       sync.WaitGroup
	)
	for i := range n {
		nc, err := nats.Connect(c.natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(nc.Close)
		cl := client.New(nc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ctx.Err() == nil; k++ {
				sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
				// One job in three sleeps, so that every kill finds attempts running.
				taskType, payload := "SHA256", any(map[string]string{"text": fmt.Sprintf("chaos %d-%d", i, k)})
				if k%3 == 0 {
					taskType, payload = "SLEEP", map[string]int{"durationMillis": 300}
				}
				id, err := cl.Submit(sctx, taskType, payload, client.MaxAttempts(50))
				scancel()
				if err == nil {
					mu.Lock()
					accepted = append(accepted, id)
					mu.Unlock()
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	return func() []string {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return accepted
	}
}

// verify waits for every accepted job to end, and checks that each completed and
// that the re-runs stay within what the kills could cost.
func (c *chaos) verify(accepted []string) {
	t := c.t
	nc, err := nats.Connect(c.natsURL, nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl := client.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reruns, lost := 0, 0
	for _, id := range accepted {
		j, err := cl.Wait(ctx, id)
		switch {
		case err != nil:
			t.Fatalf("job %s: %v", id, err)
		case j.State != protocol.StateCompleted:
			lost++
			if lost <= 5 {
				t.Errorf("job %s ended %s after %d attempts: %s", id, j.State, j.Attempts, deref(j.Error))
			}
		}
		reruns += j.Attempts - 1
	}
	t.Logf("accepted %d; serve SIGKILLed %d times, worker processes %d, TCP sockets cut %d; not completed %d; re-runs %d (at most %d: the capacity the kills took down)",
		len(accepted), c.serveKills, c.workerKills, c.tcpCuts, lost, reruns, c.capacityKilled)
	if len(accepted) == 0 {
		t.Fatal("no job accepted")
	}
	if reruns > c.capacityKilled {
		t.Errorf("%d re-runs, more than the %d attempts the kills could have cut short", reruns, c.capacityKilled)
	}
}

// tcpConns remembers the TCP workers' connections, so that the test can cut one.
type tcpConns struct {
	mu    sync.Mutex
	conns []*net.TCPConn
}

func (tc *tcpConns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc.mu.Lock()
	tc.conns = append(tc.conns, conn.(*net.TCPConn))
	tc.mu.Unlock()
	return conn, nil
}

// cut ends the oldest connection still open; reset sends RST instead of FIN.
func (tc *tcpConns) cut(reset bool) bool {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	for len(tc.conns) > 0 {
		conn := tc.conns[0]
		tc.conns = tc.conns[1:]
		if reset {
			_ = conn.SetLinger(0)
		}
		if conn.Close() == nil {
			return true
		}
	}
	return false
}
