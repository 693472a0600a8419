package cli_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/embeddednats"
)

// What a newcomer meets in the first hour: each mistake answered by what to do.

// holdPort listens on a free loopback port until the test ends, as a first serve's
// listener would.
func holdPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l.Addr().String()
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSecondServeNamesEveryConflict: a serve started where another runs names, in one
// message, every address in use and the store in use, each with the flag that moves it,
// instead of one per start.
func TestSecondServeNamesEveryConflict(t *testing.T) {
	t.Parallel()
	// The first system: its embedded NATS holds the client port and the store.
	dir := t.TempDir()
	first, err := embeddednats.Start(context.Background(), embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Shutdown(context.Background()) })
	natsAddr := strings.TrimPrefix(first.ClientURL(), "nats://")
	workerAddr, clientAddr, httpAddr, monAddr := holdPort(t), holdPort(t), holdPort(t), holdPort(t)

	code, out, errs := cliRun(nil, "serve", "--data-dir", dir, "--nats-listen", natsAddr,
		"--worker-port", port(t, workerAddr), "--client-port", port(t, clientAddr),
		"--http-listen", httpAddr, "--nats-http-listen", monAddr)
	if code != cli.ExitError || out != "" {
		t.Fatalf("exit %d, stdout %q; want %d and nothing", code, out, cli.ExitError)
	}
	if !strings.Contains(errs, "cannot start: 5 ports are in use and the store is locked by another server") {
		t.Errorf("stderr does not sum the conflicts up:\n%s", errs)
	}
	for _, want := range [][2]string{
		{natsAddr, "--nats-listen 127.0.0.1:PORT"},
		{monAddr, "--nats-http-listen 127.0.0.1:PORT"},
		{workerAddr, "--worker-port PORT"},
		{clientAddr, "--client-port PORT"},
		{httpAddr, "--http-listen 127.0.0.1:PORT"},
		{dir, "--data-dir DIR"},
	} {
		found := false
		for _, line := range strings.Split(errs, "\n") {
			found = found || (strings.Contains(line, want[0]) && strings.Contains(line, want[1]))
		}
		if !found {
			t.Errorf("no line names %s with %s:\n%s", want[0], want[1], errs)
		}
	}

	// One address given to two of serve's listeners is a conflict too, and the bridge
	// command checks its ports the same way.
	code, _, errs = cliRun([]string{"--nats", first.ClientURL()}, "bridge", "--worker-port", port(t, workerAddr), "--client-port", "0", "--http-listen", workerAddr)
	if code != cli.ExitError || !strings.Contains(errs, "cannot start: 2 ports are in use") ||
		!strings.Contains(errs, "--worker-port PORT") || !strings.Contains(errs, "given to --worker-port too") {
		t.Errorf("bridge: exit %d, stderr:\n%s", code, errs)
	}
}

// TestWorkerPortGivenToAClient: a client command pointed at the worker port is told
// which port clients use, from what that port answered.
func TestWorkerPortGivenToAClient(t *testing.T) {
	t.Parallel()
	s := setup(t, noWorker())
	br := s.StartBridge(t, func(c *bridge.Config) { c.ClientListen = "" })
	addr := br.WorkerAddr().String()
	for _, args := range [][]string{{"jobs"}, {"submit", "sha256", "--text", "x"}, {"status", "some-id"}} {
		code, _, errs := cliRun([]string{"--connect", addr}, args...)
		want := addr + ` is a worker port (it answered "First message must be WORKER_REGISTER"); clients use the bridge's client port (7071 by default)`
		if code != cli.ExitError || !strings.Contains(errs, want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", args, code, errs, cli.ExitError, want)
		}
	}
}

// TestOneHintPerMessage: however many layers a missing jobbus passes through, the
// message says once how to start it.
func TestOneHintPerMessage(t *testing.T) {
	t.Parallel()
	dead := startNATS(t)
	deadURL := dead.url
	dead.NC.Close()
	if err := dead.Server.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	bare := startNATS(t) // NATS with no coordinator
	bare.startBridge()   // and a bridge with none behind it
	cases := []struct {
		name   string
		global []string
		want   string
	}{
		{"ClientPortClosed", []string{"--connect", freeAddr(t)}, "cannot reach the jobbus client port at 127.0.0.1:"},
		{"NATSDown", []string{"--nats", deadURL}, "cannot reach NATS at " + deadURL},
		{"NoCoordinator", []string{"--nats", bare.url}, "no jobbus coordinator answered on " + bare.url},
		{"BridgeWithoutCoordinator", []string{"--connect", bare.clientAddr}, "coordinator unavailable"},
	}
	for _, tc := range cases {
		code, _, errs := cliRun(tc.global, "status", "x")
		if code != cli.ExitError || !strings.Contains(errs, tc.want) || strings.Count(errs, "running?)") != 1 {
			t.Errorf("%s: exit %d, stderr %q; want %q with one hint", tc.name, code, errs, tc.want)
		}
	}
}

// TestUnsetIDVariable: the README's `jobbus status "$id"` pasted in a terminal where id
// was never set is a mistake on the command line (exit 2) that says the ID is empty,
// not a question to the coordinator answered "Unknown job: ".
func TestUnsetIDVariable(t *testing.T) {
	t.Parallel()
	s := setup(t, noWorker())
	for _, args := range [][]string{{"status", "", "--follow"}, {"logs", "", "--follow"}, {"cancel", ""}, {"wait", " "}} {
		code, _, errs := cliRun([]string{"--nats", s.url}, args...)
		want := args[0] + ": ID is empty (a shell variable that is not set?)"
		if code != cli.ExitUsage || !strings.Contains(errs, want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", args, code, errs, cli.ExitUsage, want)
		}
	}
}

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestHelpPointsToDocsThatExist: where a command's help sends the reader to a page of
// docs/, that page is in the repository; and the services' help sends them somewhere.
func TestHelpPointsToDocsThatExist(t *testing.T) {
	t.Parallel()
	ref := regexp.MustCompile(`docs/[A-Za-z0-9_-]+\.[a-z]+`)
	app := cli.App(io.Discard, io.Discard)
	for _, cmd := range app.Commands {
		if cmd.Name == "help" {
			continue
		}
		code, out, _ := cliRun(nil, cmd.Name, "--help")
		if code != cli.ExitOK {
			t.Fatalf("%s --help: exit %d", cmd.Name, code)
		}
		pages := ref.FindAllString(out, -1)
		for _, p := range pages {
			if _, err := os.Stat(filepath.Join("..", p)); err != nil {
				t.Errorf("%s --help points to %s: %v", cmd.Name, p, err)
			}
		}
		switch cmd.Name {
		case "serve", "coordinator", "bridge", "bench", "dashboard", "cluster":
			if len(pages) == 0 {
				t.Errorf("%s --help points to no page of docs/:\n%s", cmd.Name, out)
			}
		}
	}
}
