package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/jobbustest/suite"
	"github.com/jobbus/jobbus/worker"
)

// TestExampleConfigWorkerIdentity: with docs/nats-server.conf, a worker's NATS user
// decides as whom it speaks. edge-1 may speak only as edge-1: NATS refuses what it
// sends in edge-2's name, and the coordinator refuses (403) what it sends as itself
// for edge-2. The shared worker user, which NATS lets speak as any worker, meets the
// coordinator's check too: it may not speak for edge-1 as another worker, nor report
// a result for edge-1's attempt (which it can overhear). None of it costs edge-1
// anything: its job runs on, and it completes the next.
func TestExampleConfigWorkerIdentity(t *testing.T) {
	t.Parallel()
	url := configServer(t)
	ctx := context.Background()
	runConfigCoordinator(t, url)

	edgeInbox := nats.CustomInboxPrefix("_INBOX_edge-1")
	w, err := worker.Connect(ctx, userURL(url, "edge-1"), worker.WithID("edge-1"),
		worker.WithBusOptions(bus.WithNATSOptions(edgeInbox)),
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

	// The shared worker user hears every worker's subjects: it overhears edge-1's
	// assignment, and so its attempt id.
	spy, err := nats.Connect(userURL(url, "worker"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(spy.Close)
	// A native worker gets its assignments in batches (protocol.PathAssigns).
	overheard, err := spy.SubscribeSync("jobbus.node.worker.edge-1.*.*." + protocol.PathAssigns)
	if err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	code, out, errs := submitter("submit", "sleep", "--milliseconds", "600000")
	if code != cli.ExitOK {
		t.Fatalf("submit: exit %d %s", code, errs)
	}
	sleeping := strings.TrimSpace(out)
	m, err := overheard.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("edge-1's assignment not overheard: %v", err)
	}
	var batch protocol.TaskAssigns
	if err := json.Unmarshal(m.Data, &batch); err != nil || len(batch.Assigns) != 1 || batch.Assigns[0].JobID != sleeping {
		t.Fatalf("overheard %q (%v), want the assignment of %s", m.Data, err, sleeping)
	}
	a := batch.Assigns[0]

	// speaker connects as user and speaks on the bus as as; NATS's refusals arrive on
	// the channel.
	speaker := func(t *testing.T, user string, as bus.Address) (*bus.Node, <-chan error) {
		violations := make(chan error, 8)
		opts := []nats.Option{nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case violations <- err:
			default:
			}
		})}
		if user == "edge-1" {
			opts = append(opts, edgeInbox)
		}
		n, err := bus.Connect(ctx, userURL(url, user), as, bus.WithLogger(nil), bus.WithNATSOptions(opts...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		return n, violations
	}
	register := func(id string) *protocol.WorkerRegister { return &protocol.WorkerRegister{WorkerID: id, Capacity: 4} }
	asWorker := func(id string) bus.Address { return bus.Address{Role: bus.RoleWorker, ID: id} }
	const (
		byNATS        = "nats"
		byCoordinator = "coordinator"
	)
	for _, tc := range []struct {
		name       string
		user       string
		as         bus.Address
		path       string
		req        any
		refusedBy  string
		refusalSay string
	}{
		{"Edge1RegistersAsEdge2", "edge-1", asWorker("edge-2"), protocol.PathRegister, register("edge-2"),
			byNATS, `Permissions Violation for Publish to "jobbus.role.coordinator.worker.edge-2.worker.register"`},
		{"Edge1ReportsAsEdge2", "edge-1", asWorker("edge-2"), protocol.PathResult, suite.Result("edge-2", a, true, "forged"),
			byNATS, `Permissions Violation for Publish to "jobbus.role.coordinator.worker.edge-2.task.result"`},
		{"Edge1RegistersEdge2", "edge-1", asWorker("edge-1"), protocol.PathRegister, register("edge-2"),
			byCoordinator, "worker/edge-1 may not speak for worker/edge-2"},
		{"Edge1BeatsForEdge2", "edge-1", asWorker("edge-1"), protocol.PathHeartbeat, &protocol.Heartbeat{WorkerID: "edge-2"},
			byCoordinator, "worker/edge-1 may not speak for worker/edge-2"},
		{"SharedUserAsCoordinator", "worker", bus.Address{Role: bus.RoleCoordinator, ID: "c1"}, protocol.PathRegister, register("edge-1"),
			byNATS, `Permissions Violation for Publish to "jobbus.role.coordinator.coordinator.c1.worker.register"`},
		{"SharedUserRegistersEdge1", "worker", asWorker("spy"), protocol.PathRegister, register("edge-1"),
			byCoordinator, "worker/spy may not speak for worker/edge-1"},
		{"SharedUserDrainsEdge1", "worker", asWorker("spy"), protocol.PathDrain, &protocol.Drain{WorkerID: "edge-1"},
			byCoordinator, "worker/spy may not speak for worker/edge-1"},
		{"SharedUserReportsEdge1sAttempt", "worker", asWorker("spy"), protocol.PathResult, suite.Result("spy", a, true, "forged"),
			byCoordinator, "attempt " + a.AttemptID + " of job " + sleeping + " was assigned to worker edge-1, not to worker spy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, violations := speaker(t, tc.user, tc.as)
			if tc.refusedBy == byNATS {
				// NATS drops the message, so nobody answers: the ask times out.
				actx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				if _, err := bus.Ask[json.RawMessage](actx, n, bus.Address{Role: bus.RoleCoordinator}, tc.path, tc.req); !errors.Is(err, bus.ErrTimeout) {
					t.Fatalf("ask: %v, want no answer", err)
				}
				select {
				case err := <-violations:
					if !strings.Contains(err.Error(), tc.refusalSay) {
						t.Fatalf("NATS said %v, want %s", err, tc.refusalSay)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("NATS let it through")
				}
				return
			}
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := bus.Ask[json.RawMessage](actx, n, bus.Address{Role: bus.RoleCoordinator}, tc.path, tc.req)
			if !errors.Is(err, bus.CodeForbidden) || !strings.Contains(err.Error(), tc.refusalSay) {
				t.Fatalf("ask: %v, want 403 saying %q", err, tc.refusalSay)
			}
		})
	}

	// edge-1 still holds its attempt, is still the only worker, and takes new work.
	code, out, errs = submitter("status", sleeping, "--json")
	if j := jsonJob(t, out); code != cli.ExitOK || j.State != protocol.StateRunning || j.Attempts != 1 || suite.Deref(j.WorkerID) != "edge-1" {
		t.Fatalf("edge-1's job after the impostors: exit %d %+v %s", code, j, errs)
	}
	code, out, errs = submitter("workers", "--json")
	if code != cli.ExitOK || strings.Count(out, `"workerId"`) != 1 || !strings.Contains(out, `"edge-1"`) {
		t.Fatalf("workers after the impostors: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := submitter("cancel", sleeping); code != cli.ExitOK {
		t.Fatalf("cancel: exit %d %s", code, errs)
	}
	if code, out, errs := submitter("submit", "sha256", "--text", "hi", "--wait", "--json"); code != cli.ExitOK || !strings.Contains(out, `"COMPLETED"`) {
		t.Fatalf("edge-1's next job: exit %d\n%s%s", code, out, errs)
	}
}
