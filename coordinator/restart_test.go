package coordinator_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/testkit"
)

func TestRestart(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		t.Run("CompletedJobsSurvive", func(t *testing.T) {
			t.Parallel()
			s := setup(t, tr)
			_, stop := s.startWorker(4)
			id := s.submit("SHA256", text("abc"))
			before := s.wait(id)
			stop()
			s.RestartCoordinator(t)
			if after := s.status(id); !reflect.DeepEqual(after, before) {
				t.Fatalf("after restart %+v, before %+v", after, before)
			}
		})
		t.Run("RunningJobRunsAgain", func(t *testing.T) {
			t.Parallel()
			s := setup(t, tr)
			m := s.silentWorker("gone", 1)
			id := s.submit("SHA256", text("abc"))
			first := s.nextAssign(m)
			s.RestartCoordinator(t)
			j := s.status(id)
			if j.State != protocol.StateQueued || j.Attempts != 1 {
				t.Fatalf("after restart %+v, want QUEUED with the lost attempt counted", j)
			}
			s.reject(m, first, true, "from the old lease")
			s.startWorker(4)
			if j := s.wait(id); j.State != protocol.StateCompleted || j.Attempts != 2 {
				t.Fatalf("job %+v, want COMPLETED on attempt 2", j)
			}
		})
		t.Run("FinalAttemptFails", func(t *testing.T) {
			t.Parallel()
			s := setup(t, tr)
			m := s.silentWorker("gone", 1)
			id := s.submit("SHA256", text("abc"), client.MaxAttempts(1))
			s.nextAssign(m)
			s.RestartCoordinator(t)
			j := s.status(id)
			if j.State != protocol.StateFailed || deref(j.Error) != "coordinator restarted during final attempt; outcome unknown" {
				t.Fatalf("after restart %+v error %q", j, deref(j.Error))
			}
		})
		t.Run("StaleDeadlineNotApplied", func(t *testing.T) {
			t.Parallel()
			clk := &clock{now: time.Now()}
			s := setup(t, tr, func(c *coordinator.Config) {
				c.Now, c.TaskTimeout, c.HeartbeatTimeout = clk.Now, time.Minute, time.Hour
			})
			old := s.silentWorker("old", 1)
			id := s.submit("SHA256", text("abc"))
			s.nextAssign(old) // its deadline: t0 + 60s
			clk.advance(50 * time.Second)
			s.RestartCoordinator(t)
			fresh := s.silentWorker("fresh", 2)
			a := s.nextAssign(fresh) // its deadline: t0 + 110s
			probe := s.submit("FAIL", map[string]int{"failUntilAttempt": 2})
			s.accept(fresh, s.nextAssign(fresh), false, "probe fails once")
			clk.advance(20 * time.Second) // past the first attempt's deadline only
			// The sweep that releases the probe's retry would also apply any deadline due.
			s.eventually("a sweep at t0+70s", func() bool { return s.status(probe).State != protocol.StateRetryWait })
			if j := s.status(id); j.State != protocol.StateRunning || j.Attempts != 2 {
				t.Fatalf("the second attempt was cut short: %+v (error %q)", j, deref(j.Error))
			}
			s.accept(fresh, a, true, "done")
			if j := s.status(id); j.State != protocol.StateCompleted || j.Error != nil {
				t.Fatalf("job %+v error %q", j, deref(j.Error))
			}
		})
		t.Run("PriorityAndSequenceSurvive", func(t *testing.T) {
			t.Parallel()
			s := setup(t, tr)
			low := s.submit("SHA256", text("1"), client.Priority(protocol.PriorityLow))
			normal := s.submit("SHA256", text("2"))
			high := s.submit("SHA256", text("3"), client.Priority(protocol.PriorityHigh))
			s.RestartCoordinator(t)
			normal2 := s.submit("SHA256", text("4"))
			got := runOneByOne(s, 4)
			want := []string{high, normal, normal2, low}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("order after restart %v, want %v", got, want)
			}
			page, err := s.client.List(context.Background(), protocol.ListJobs{})
			must(t, err)
			if len(page.Jobs) != 4 || page.Jobs[0].JobID != normal2 || page.Jobs[3].JobID != low {
				t.Fatalf("list newest first: %+v", page.Jobs)
			}
		})
	})
}

// runOneByOne registers a one-slot worker and returns the order it is given n jobs in.
func runOneByOne(s *system, n int) []string {
	s.t.Helper()
	m := s.manualWorker("one-by-one", 1)
	var order []string
	for range n {
		a := s.nextAssign(m)
		order = append(order, a.JobID)
		s.accept(m, a, true, "ok")
	}
	return order
}

// clock is a settable clock for aging tests.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestPriorityOrder(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr transport) {
		clk := &clock{now: time.Now()}
		s := setup(t, tr, func(c *coordinator.Config) {
			c.Now = clk.Now
			c.AgingStep = time.Minute
			c.HeartbeatTimeout = time.Hour // the clock stands still between steps
		})
		lowOld := s.submit("SHA256", text("a"), client.Priority(protocol.PriorityLow))
		normalOld := s.submit("SHA256", text("b"))
		clk.advance(time.Minute) // lowOld is NORMAL now, normalOld HIGH
		high := s.submit("SHA256", text("c"), client.Priority(protocol.PriorityHigh))
		normal := s.submit("SHA256", text("d"), client.Priority(protocol.PriorityNormal))
		low := s.submit("SHA256", text("e"), client.Priority(protocol.PriorityLow))
		got := runOneByOne(s, 5)
		// Effective: normalOld HIGH(seq 2), high HIGH(3), lowOld NORMAL(1), normal NORMAL(4), low LOW(5).
		want := []string{normalOld, high, lowOld, normal, low}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("order %v,\nwant  %v", got, want)
		}
		if j := s.status(lowOld); j.Priority != protocol.PriorityLow {
			t.Fatalf("snapshot shows priority %s, want the base LOW", j.Priority)
		}
	})
}

// The tests below run the real binary and kill it with SIGKILL.

var (
	binary     string
	buildOnce  sync.Once
	buildError error
)

// jobbusBinary builds the binary once per test run, for the tests that kill it.
func jobbusBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "jobbus-bin-")
		if err != nil {
			buildError = err
			return
		}
		binary = filepath.Join(dir, "jobbus")
		out, err := exec.Command("go", "build", "-race", "-o", binary, "github.com/jobbus/jobbus").CombinedOutput()
		if err != nil {
			buildError = fmt.Errorf("build jobbus: %v\n%s", err, out)
		}
	})
	if buildError != nil {
		t.Fatal(buildError)
	}
	return binary
}

func removeBinary() {
	if binary != "" {
		_ = os.RemoveAll(filepath.Dir(binary))
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// serveProcess runs `jobbus serve` on dataDir and port until the test ends.
func serveProcess(t *testing.T, dataDir string, port int, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(jobbusBinary(t), append([]string{"serve", "--data-dir", dataDir, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--sweep-interval-millis", "10", "--heartbeat-timeout-millis", "1000", "--worker-port", "0", "--client-port", "0", "--http-listen", "127.0.0.1:0"}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	must(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func connectWhenUp(t *testing.T, port int) (*nats.Conn, *client.Client) {
	t.Helper()
	var nc *nats.Conn
	testkit.Eventually(t, 30*time.Second, "jobbus serve to answer", func() bool {
		var err error
		if nc == nil {
			if nc, err = nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port)); err != nil {
				return false
			}
		}
		_, err = client.New(nc).Workers(context.Background())
		return err == nil
	})
	t.Cleanup(nc.Close)
	return nc, client.New(nc)
}

func TestSIGKILLLosesNoAcceptedJob(t *testing.T) {
	t.Parallel()
	dir, port := t.TempDir(), freePort(t)
	proc := serveProcess(t, dir, port, "--workers", "1", "--worker-capacity", "2")
	nc, c := connectWhenUp(t, port)
	ctx := context.Background()
	var accepted []string
	for i := range 40 {
		id, err := c.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 50 * (i % 3)})
		must(t, err)
		accepted = append(accepted, id)
	}
	testkit.Eventually(t, 10*time.Second, "some jobs running", func() bool {
		page, err := c.List(ctx, protocol.ListJobs{State: ptrState(protocol.StateRunning)})
		return err == nil && len(page.Jobs) > 0
	})
	must(t, proc.Process.Signal(syscall.SIGKILL))
	_ = proc.Wait()
	nc.Close()

	serveProcess(t, dir, port, "--workers", "2", "--worker-capacity", "8")
	_, c = connectWhenUp(t, port)
	for _, id := range accepted {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		j, err := c.Wait(wctx, id)
		cancel()
		if err != nil || j.State != protocol.StateCompleted {
			t.Fatalf("accepted job %s after SIGKILL: %+v %v", id, j, err)
		}
	}
}

func ptrState(s protocol.State) *protocol.State { return &s }

// TestSIGKILLedServeTakesItsLeaseBack: serve restarted on its store after a SIGKILL
// serves without waiting out the lease its dead process left: the lease here (two
// minutes) is far longer than the wait allowed for serving again.
func TestSIGKILLedServeTakesItsLeaseBack(t *testing.T) {
	t.Parallel()
	dir, port := t.TempDir(), freePort(t)
	lease := []string{"--leader-lease-millis", "120000", "--workers", "1"}
	proc := serveProcess(t, dir, port, lease...)
	nc, c := connectWhenUp(t, port)
	id, err := c.Submit(context.Background(), "SHA256", map[string]string{"text": "before the crash"})
	must(t, err)
	must(t, proc.Process.Signal(syscall.SIGKILL))
	_ = proc.Wait()
	nc.Close()

	serveProcess(t, dir, port, lease...)
	_, c = connectWhenUp(t, port) // fails after 30 s, well inside the old lease
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if j, err := c.Wait(wctx, id); err != nil || j.State != protocol.StateCompleted {
		t.Fatalf("job accepted before the crash: %+v %v", j, err)
	}
}
