package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/worker"
)

// configServer runs nats-server with the example configuration (docs/nats-server.conf)
// on a random port and a fresh store, and returns its URL.
func configServer(t *testing.T) string {
	t.Helper()
	opts, err := server.ProcessConfigFile("../docs/nats-server.conf")
	if err != nil {
		t.Fatalf("docs/nats-server.conf: %v", err)
	}
	opts.Port = server.RANDOM_PORT
	opts.StoreDir = t.TempDir()
	return runNATS(t, opts).ClientURL()
}

// runNATS starts nats-server with opts, quiet, until the test ends.
func runNATS(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return ns
}

// userURL is url with a user of the example configuration.
func userURL(url, user string) string {
	return strings.Replace(url, "nats://", "nats://"+user+":change-me-"+user+"@", 1)
}

// runConfigCoordinator runs a coordinator under the coordinator user of the example
// config on url (configServer) until the test ends; workers are lost after 5 s of
// silence, for a loaded machine.
func runConfigCoordinator(t *testing.T, url string) {
	t.Helper()
	nc, err := nats.Connect(userURL(url, "coordinator"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := jobbustest.FastCoordinatorConfig()
	cfg.HeartbeatTimeout = 5 * time.Second
	jobbustest.Go(t, func(ctx context.Context) error { return coordinator.Run(ctx, nc, cfg, nil) })
}

// TestExampleConfigPermissions: with docs/nats-server.conf, the coordinator and a
// worker run under their own users, the submitter submits and cancels, and the reader
// reads status, lists and workers but is refused, by NATS, a submission and a cancel.
func TestExampleConfigPermissions(t *testing.T) {
	t.Parallel()
	url := configServer(t)
	ctx := context.Background()

	runConfigCoordinator(t, url)

	w, err := worker.Connect(ctx, userURL(url, "worker"), worker.WithHeartbeat(100*time.Millisecond), worker.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	stopWorker := jobbustest.Go(t, w.Run)
	t.Cleanup(func() { stopWorker(); _ = w.Close() })

	as := func(user string) func(args ...string) (int, string, string) {
		return func(args ...string) (int, string, string) {
			return cliRun([]string{"--nats", userURL(url, user)}, args...)
		}
	}
	submitter, reader := as("submitter"), as("reader")
	eventually(t, "worker listed to the reader", func() bool {
		_, out, _ := reader("workers", "--json")
		return strings.Contains(out, w.ID())
	})

	code, out, errs := submitter("submit", "sha256", "--text", "hi", "--wait", "--json")
	if code != cli.ExitOK || !strings.Contains(out, `"COMPLETED"`) {
		t.Fatalf("submitter's submit --wait: exit %d\n%s%s", code, out, errs)
	}
	id := jsonJob(t, out).JobID
	code, out, errs = submitter("submit", "sleep", "--milliseconds", "600000")
	if code != cli.ExitOK {
		t.Fatalf("submitter's second submit: exit %d %s", code, errs)
	}
	sleeping := strings.TrimSpace(out)
	if code, _, errs := submitter("cancel", sleeping); code != cli.ExitOK {
		t.Fatalf("submitter's cancel: exit %d %s", code, errs)
	}

	for _, args := range [][]string{{"status", id}, {"jobs"}, {"workers"}} {
		if code, out, errs := reader(args...); code != cli.ExitOK || out == "" {
			t.Errorf("reader's %s: exit %d\n%s%s", args[0], code, out, errs)
		}
	}
	for _, args := range [][]string{{"submit", "sha256", "--text", "hi"}, {"cancel", id}} {
		code, out, errs := reader(args...)
		if code != cli.ExitError || !strings.Contains(errs, `Permissions Violation for Publish to "jobbus.api.`+args[0]+`"`) {
			t.Errorf("reader's %s: exit %d, stdout %q, stderr %q; want exit 1 and NATS's permissions violation", args[0], code, out, errs)
		}
	}
	// Schedules: the submitter manages them, the reader lists them only.
	if code, _, errs := submitter("schedule", "add", "nightly", "--cron", "0 0 3 * * *", "sha256", "--text", "n"); code != cli.ExitOK {
		t.Fatalf("submitter's schedule add: exit %d %s", code, errs)
	}
	if code, out, errs := reader("schedule", "ls"); code != cli.ExitOK || !strings.Contains(out, "nightly") {
		t.Errorf("reader's schedule ls: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = reader("schedule", "pause", "nightly")
	if code != cli.ExitError || !strings.Contains(errs, `Permissions Violation for Publish to "jobbus.api.schedule.pause"`) {
		t.Errorf("reader's schedule pause: exit %d, stdout %q, stderr %q; want exit 1 and NATS's permissions violation", code, out, errs)
	}
}

// TestExampleConfigRoles: with docs/nats-server.conf, a worker whose user is its id
// (edge-1) runs jobs under its own subjects and inbox, but cannot hear another
// worker's subjects nor use the client API; a submitter cannot act as a worker nor
// listen to workers; an anonymous connection is refused.
func TestExampleConfigRoles(t *testing.T) {
	t.Parallel()
	url := configServer(t)
	ctx := context.Background()
	runConfigCoordinator(t, url)

	w, err := worker.Connect(ctx, userURL(url, "edge-1"), worker.WithID("edge-1"),
		worker.WithBusOptions(bus.WithNATSOptions(nats.CustomInboxPrefix("_INBOX_edge-1"))),
		worker.WithHeartbeat(100*time.Millisecond), worker.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	stopWorker := jobbustest.Go(t, w.Run)
	t.Cleanup(func() { stopWorker(); _ = w.Close() })
	submitter := func(args ...string) (int, string, string) {
		return cliRun([]string{"--nats", userURL(url, "submitter")}, args...)
	}
	eventually(t, "edge-1 listed", func() bool {
		_, out, _ := submitter("workers", "--json")
		return strings.Contains(out, `"edge-1"`)
	})
	if code, out, errs := submitter("submit", "sha256", "--text", "hi", "--wait", "--json"); code != cli.ExitOK || !strings.Contains(out, `"COMPLETED"`) {
		t.Fatalf("a job for edge-1: exit %d\n%s%s", code, out, errs)
	}

	for _, tc := range []struct {
		user, action, subject string
	}{
		{"edge-1", "subscribe", "jobbus.node.worker.edge-2.>"}, // another worker's assignments
		{"edge-1", "subscribe", "jobbus.node.worker.>"},
		{"edge-1", "subscribe", "_INBOX.>"}, // everyone else's replies
		{"edge-1", "publish", "jobbus.api.submit"},
		{"edge-1", "publish", "jobbus.presence.worker.edge-2"},
		{"edge-1", "publish", "jobbus.role.coordinator.worker.edge-2.task.result"}, // speaking as another worker
		{"worker", "publish", "jobbus.role.coordinator.client.c1.worker.register"}, // as anything but a worker
		{"submitter", "publish", "jobbus.role.coordinator.worker.w1.worker.register"},
		{"submitter", "subscribe", "jobbus.node.worker.>"},
		{"submitter", "subscribe", "jobbus.api.>"}, // posing as the coordinator
		{"reader", "publish", "jobbus.role.coordinator.worker.w1.task.result"},
	} {
		t.Run(tc.user+"/"+tc.action+"/"+tc.subject, func(t *testing.T) {
			errs := make(chan error, 4)
			nc, err := nats.Connect(userURL(url, tc.user), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if tc.action == "publish" {
				err = nc.Publish(tc.subject, []byte("{}"))
			} else {
				_, err = nc.SubscribeSync(tc.subject)
			}
			if err == nil {
				err = nc.Flush()
			}
			if err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-errs:
				if !strings.Contains(err.Error(), "Permissions Violation") {
					t.Fatalf("got %v, want a permissions violation", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s may %s %s", tc.user, tc.action, tc.subject)
			}
		})
	}

	if nc, err := nats.Connect(url); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("an anonymous connection: %v, want an authorization violation", err)
	}
}

// TestExampleConfigWorkersShipJobLogs: with docs/nats-server.conf, a worker under the
// shared worker user, and one whose user is its id (edge-1, with its own inbox), write
// what their handlers log where `jobbus logs` finds it.
func TestExampleConfigWorkersShipJobLogs(t *testing.T) {
	t.Parallel()
	for _, user := range []string{"worker", "edge-1"} {
		t.Run(user, func(t *testing.T) {
			t.Parallel()
			url := configServer(t)
			ctx := context.Background()
			runConfigCoordinator(t, url)
			opts := []worker.Option{worker.WithHeartbeat(100 * time.Millisecond), worker.WithLogger(nil)}
			if user == "edge-1" {
				opts = append(opts, worker.WithID(user), worker.WithBusOptions(bus.WithNATSOptions(nats.CustomInboxPrefix("_INBOX_edge-1"))))
			}
			w, err := worker.Connect(ctx, userURL(url, user), opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Handle("NOTES", func(ctx context.Context, _ int, _ json.RawMessage) (string, error) {
				worker.Logger(ctx).Info("noted by the worker")
				return "ok", nil
			}); err != nil {
				t.Fatal(err)
			}
			stopWorker := jobbustest.Go(t, w.Run)
			t.Cleanup(func() { stopWorker(); _ = w.Close() })
			as := func(user string, args ...string) (int, string, string) {
				return cliRun([]string{"--nats", userURL(url, user)}, args...)
			}
			eventually(t, "worker listed", func() bool {
				_, out, _ := as("submitter", "workers", "--json")
				return strings.Contains(out, w.ID())
			})
			code, out, errs := as("submitter", "submit", "NOTES", "--payload", "{}", "--wait", "--json")
			if code != cli.ExitOK || !strings.Contains(out, `"COMPLETED"`) {
				t.Fatalf("submit --wait: exit %d\n%s%s", code, out, errs)
			}
			id := jsonJob(t, out).JobID
			eventually(t, "the handler's record in the job's log", func() bool {
				code, out, _ := as("coordinator", "logs", id)
				return code == cli.ExitOK && strings.Contains(out, "noted by the worker")
			})
		})
	}
}

// TestExampleConfigClusterRefusedSays: with docs/nats-server.conf, `jobbus cluster`
// under a user that may not ask the servers (the reader) fails with NATS's permissions
// violation, not with a bare "context canceled".
func TestExampleConfigClusterRefusedSays(t *testing.T) {
	t.Parallel()
	url := configServer(t)
	runConfigCoordinator(t, url)
	code, out, errs := cliRun([]string{"--nats", userURL(url, "reader")}, "cluster")
	if code != cli.ExitError || !strings.Contains(errs, "Permissions Violation for Publish to") {
		t.Errorf("reader's cluster: exit %d, stdout %q, stderr %q; want exit 1 and NATS's permissions violation", code, out, errs)
	}
}

// TestExampleConfigReaderReadsEverything: with docs/nats-server.conf, the reader reads
// what the system has to show over the API, queues, rate limits and workflows as well
// as jobs, and changes none of it.
func TestExampleConfigReaderReadsEverything(t *testing.T) {
	t.Parallel()
	url := configServer(t)
	runConfigCoordinator(t, url)
	as := func(user string, args ...string) (int, string, string) {
		return cliRun([]string{"--nats", userURL(url, user)}, args...)
	}
	file := filepath.Join(t.TempDir(), "wf.json")
	if err := os.WriteFile(file, []byte(`{"workflowId": "wf-read", "chain": "a -> b", "steps": [
		{"name": "a", "taskType": "SHA256", "payload": {"text": "a"}},
		{"name": "b", "taskType": "SHA256", "payload": {"text": "b"}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a coordinator serving", func() bool { code, _, _ := as("submitter", "jobs"); return code == cli.ExitOK })
	if code, out, errs := as("submitter", "workflow", "submit", file); code != cli.ExitOK {
		t.Fatalf("submitter's workflow submit: exit %d\n%s%s", code, out, errs)
	}
	for _, args := range [][]string{{"queue", "ls"}, {"limit", "ls"}, {"workflow", "status", "wf-read"}} {
		if code, out, errs := as("reader", args...); code != cli.ExitOK || out == "" {
			t.Errorf("reader's %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errs)
		}
	}
	for _, args := range [][]string{{"queue", "pause", "default"}, {"workflow", "cancel", "wf-read"}} {
		if code, out, errs := as("reader", args...); code != cli.ExitError || !strings.Contains(errs, "Permissions Violation") {
			t.Errorf("reader's %s: exit %d, stdout %q, stderr %q; want exit 1 and NATS's permissions violation", strings.Join(args, " "), code, out, errs)
		}
	}
}

// TestExampleConfigLogsAndWatchRefusedSay: with docs/nats-server.conf, `jobbus logs`
// and `jobbus watch` read JetStream, which the reader may not: they fail with NATS's
// permissions violation (exit 1), not with nothing printed and exit 0, nor a bare
// "context canceled".
func TestExampleConfigLogsAndWatchRefusedSay(t *testing.T) {
	t.Parallel()
	url := configServer(t)
	runConfigCoordinator(t, url)
	as := func(user string, args ...string) (int, string, string) {
		return cliRun([]string{"--nats", userURL(url, user)}, args...)
	}
	eventually(t, "a coordinator serving", func() bool { code, _, _ := as("submitter", "jobs"); return code == cli.ExitOK })
	code, out, errs := as("submitter", "submit", "sha256", "--text", "hi")
	if code != cli.ExitOK {
		t.Fatalf("submitter's submit: exit %d %s", code, errs)
	}
	id := strings.TrimSpace(out)
	for _, args := range [][]string{{"logs", id}, {"watch"}} {
		code, out, errs := as("reader", args...)
		if code != cli.ExitError || !strings.Contains(errs, `Permissions Violation for Publish to "$JS.API.`) {
			t.Errorf("reader's %s: exit %d, stdout %q, stderr %q; want exit 1 and NATS's permissions violation", args[0], code, out, errs)
		}
	}
}

// TestExampleConfigDashboardRefusedSays: with docs/nats-server.conf, `jobbus dashboard`
// under a user without JetStream access (the reader) exits 1 with NATS's permissions
// violation naming the JetStream API, as logs and watch do, instead of waiting for
// JetStream for ever.
func TestExampleConfigDashboardRefusedSays(t *testing.T) {
	t.Parallel()
	url := configServer(t)
	runConfigCoordinator(t, url)
	p := startProc(t, nil, "--nats", userURL(url, "reader"), "dashboard", "--http-listen", "127.0.0.1:0")
	if code := p.wait(); code != cli.ExitError || !strings.Contains(p.stderr.String(), `Permissions Violation for Publish to "$JS.API.`) {
		t.Errorf("reader's dashboard: exit %d, stderr %q; want exit 1 and NATS's permissions violation", code, p.stderr.String())
	}
}
