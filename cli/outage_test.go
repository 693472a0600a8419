package cli_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

var (
	natsServerOnce sync.Once
	natsServerBin  string
	natsServerErr  error
)

// natsServer runs an external nats-server with JetStream on port and store dir, built
// once from the module's own nats-server dependency; it returns once the server
// accepts connections.
func natsServer(t *testing.T, port int, dir string) *exec.Cmd {
	t.Helper()
	buildNATSServer(t)
	cmd := exec.Command(natsServerBin, "-js", "-sd", dir, "-a", "127.0.0.1", "-p", strconv.Itoa(port))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	url := "nats://" + hostPort(port)
	eventually(t, "nats-server up", func() bool {
		nc, err := nats.Connect(url)
		if err == nil {
			nc.Close()
		}
		return err == nil
	})
	return cmd
}

// buildNATSServer builds nats-server once from the module's own dependency, into
// natsServerBin.
func buildNATSServer(t *testing.T) {
	t.Helper()
	natsServerOnce.Do(func() {
		natsServerBin = filepath.Join(filepath.Dir(jobbusBin), "nats-server")
		out, err := exec.Command("go", "build", "-o", natsServerBin, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsServerErr = fmt.Errorf("build nats-server: %v\n%s", err, out)
		}
	})
	if natsServerErr != nil {
		t.Fatal(natsServerErr)
	}
}

// reconnecting connects to url with a connection that rides out a nats-server's
// outage, reconnecting every 50 ms; the test's end closes it.
func reconnecting(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestCoordinatorSurvivesNATSOutage is issue 9's outage scenario with real processes:
// an external nats-server is SIGKILLed under a coordinator and a worker, stays away
// for 5 s (more than the leader lease), and comes back on the same store. Every request
// afterwards is answered and every job runs: no subscription is left behind that takes
// requests and answers none.
func TestCoordinatorSurvivesNATSOutage(t *testing.T) {
	t.Parallel()
	port := freePorts(t, 1)[0]
	dir := t.TempDir()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	server := natsServer(t, port, dir)
	nc := reconnecting(t, url)
	coord := startProc(t, nil, "--nats", url, "coordinator", "--http-listen", "-")
	coord.logged(`msg="coordinator serving"`)
	startProc(t, nil, "--nats", url, "worker", "--heartbeat-interval-millis", "200")
	cl := client.New(nc)
	submitAndWait := func(what string) {
		t.Helper()
		var id string
		eventually(t, what+" accepted", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var err error
			id, err = cl.Submit(ctx, "SHA256", map[string]string{"text": what})
			return err == nil
		})
		eventually(t, what+" completed", func() bool {
			j, err := cl.Status(context.Background(), id)
			return err == nil && j.State == protocol.StateCompleted
		})
	}
	submitAndWait("before")

	if err := server.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // the outage itself, not a wait for anything
	natsServer(t, port, dir)
	submitAndWait("first after")

	// Every request is answered now, not only some: a left-behind subscription in the
	// API's queue group would take its share and answer none.
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := cl.Submit(ctx, "SHA256", map[string]string{"text": fmt.Sprint(i)})
		cancel()
		if err != nil {
			t.Fatalf("submission %d after the outage: %v\ncoordinator:\n%s", i, err, coord.stderr.String())
		}
	}
	if os.Getenv("JOBBUS_DEBUG") != "" {
		t.Log(coord.stderr.String())
	}
}
