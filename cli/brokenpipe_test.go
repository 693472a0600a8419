package cli_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// pipedProc is jobbus whose stdout and stderr are one pipe that the test reads until
// it closes its end: from then on every write of the process's log hits a broken pipe,
// as `jobbus serve 2>&1 | tee serve.log` does once Ctrl-C has ended tee.
type pipedProc struct {
	t     *testing.T
	cmd   *exec.Cmd
	lines chan string
	r     *os.File
	done  chan struct{}
}

func startPiped(t *testing.T, args ...string) *pipedProc {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(jobbusBin, args...)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatalf("start jobbus: %v", err)
	}
	_ = w.Close() // the process has its own
	p := &pipedProc{t: t, cmd: cmd, lines: make(chan string, 1024), r: r, done: make(chan struct{})}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // nobody waits for lines any more
			}
		}
	}()
	go func() {
		defer close(p.done)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		_ = r.Close()
	})
	return p
}

// until reads the log until a line matches re, and returns its submatches.
func (p *pipedProc) until(re string) []string {
	p.t.Helper()
	rx := regexp.MustCompile(re)
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("log ended before a line matching %s", re)
			}
			if m := rx.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-timeout:
			p.t.Fatalf("no log line matching %s within 30s", re)
		}
	}
}

// breakPipe closes the reading end: the process's next write fails.
func (p *pipedProc) breakPipe() { _ = p.r.Close() }

// exit signals the process and waits for it to end, failing unless it exited 0 on its
// own (a process killed by SIGPIPE has no exit code).
func (p *pipedProc) exitOn(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		p.t.Fatal("still running 60 s after the signal")
	}
	st := p.cmd.ProcessState
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		p.t.Fatalf("killed by %v instead of draining", ws.Signal())
	}
	if st.ExitCode() != 0 {
		p.t.Fatalf("exited %d, want 0", st.ExitCode())
	}
}

// TestServiceDrainsWithABrokenLogPipe: serve and a worker whose log goes to a pipe whose
// reader has gone still drain on Ctrl-C: the running job completes on its first attempt,
// the process exits 0, and serve's store opens again without a rebuild.
func TestServiceDrainsWithABrokenLogPipe(t *testing.T) {
	t.Parallel()
	t.Run("Serve", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		p := startPiped(t, "serve", "--data-dir", dir, "--nats-listen", "127.0.0.1:-1", "--worker-port", "-1",
			"--client-port", "-1", "--http-listen", "-", "--workers", "1", "--shutdown-grace", "30s")
		url := p.until(`msg="embedded NATS started" url=(\S+)`)[1]
		p.until(`msg="(coordinator|jobbus) serving"`)
		p.until(`msg="(coordinator|jobbus) serving"`)
		p.breakPipe()
		cl := client.New(natsConnect(t, url))
		id := submitRunning(t, cl)
		p.exitOn(syscall.SIGINT)

		again, url := serveProc(t, dir)
		if j := jobNow(t, client.New(natsConnect(t, url)), id); j.State != protocol.StateCompleted || j.Attempts != 1 {
			t.Errorf("after the drain the job is %s after %d attempts (%s), want COMPLETED after 1", j.State, j.Attempts, deref(j.Error))
		}
		if log := again.stderr.String(); strings.Contains(log, "outdated") || strings.Contains(log, "rebuild") {
			t.Errorf("the store was not closed cleanly:\n%s", log)
		}
	})
	t.Run("Worker", func(t *testing.T) {
		t.Parallel()
		s := procSystem(t)
		id := fmt.Sprintf("piped-%d", time.Now().UnixNano())
		p := startPiped(t, "worker", "--nats", s.url, "--id", id, "--heartbeat-interval-millis", "100", "--shutdown-grace", "30s")
		p.until(`msg="registered with the coordinator"`)
		p.breakPipe()
		job := submitRunning(t, client.New(s.NC))
		p.exitOn(syscall.SIGINT)
		if j := s.waitState(job, protocol.StateCompleted, protocol.StateQueued, protocol.StateRetryWait, protocol.StateFailed); j.State != protocol.StateCompleted || j.Attempts != 1 {
			t.Errorf("after the drain the job is %s after %d attempts (%s), want COMPLETED after 1", j.State, j.Attempts, deref(j.Error))
		}
	})
}

// submitRunning submits a job that sleeps a second and waits until it runs.
func submitRunning(t *testing.T, cl *client.Client) string {
	t.Helper()
	ctx := context.Background()
	id, err := cl.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 1000})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "job running", func() bool {
		j, err := cl.Status(ctx, id)
		return err == nil && j.State == protocol.StateRunning
	})
	return id
}

func jobNow(t *testing.T, cl *client.Client, id string) protocol.Job {
	t.Helper()
	j, err := cl.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}
