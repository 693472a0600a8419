package coordinator_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/testkit"
)

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
