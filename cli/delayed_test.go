package cli_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/client"
)

// TestDelayedJobsSurviveLeaderKill: jobs submitted with --in wait SCHEDULED, status and
// jobs show when they are due, and a SIGKILL of the leading coordinator process
// changes nothing: the standby (a process on the same NATS) holds the near job until
// it is due and then runs it once, and the far one (beyond the schedule window: held
// by its entry and due time only) stays SCHEDULED with its due time and its key.
func TestDelayedJobsSurviveLeaderKill(t *testing.T) {
	t.Parallel()
	s := startNATS(t)
	leader, standby := s.leaderAndStandby("--leader-lease-millis", "1000", "--schedule-window-millis", "1000")
	o := over{s, natsTransport}
	out, _ := o.mustRun(cli.ExitOK, "submit", "sha256", "--text", "near", "--in", "5s", "--json")
	near := jsonJob(t, out).JobID
	out, _ = o.mustRun(cli.ExitOK, "submit", "sha256", "--text", "far", "--at", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "--idempotency-key", "far", "--json")
	far := jsonJob(t, out).JobID
	before := map[string]protocol.Job{}
	for _, id := range []string{near, far} {
		out, _ := o.mustRun(cli.ExitOK, "status", id, "--json")
		j := jsonJob(t, out)
		if j.State != protocol.StateScheduled || j.RunAtMillis == 0 {
			t.Fatalf("status %+v, want SCHEDULED with its due time", j)
		}
		before[id] = j
	}
	out, _ = o.mustRun(cli.ExitOK, "status", far)
	if due := time.UnixMilli(before[far].RunAtMillis).UTC().Format("2006-01-02T15:04:05.000Z"); !strings.Contains(out, "DUE") || !strings.Contains(out, due) {
		t.Fatalf("status shows no due time %s:\n%s", due, out)
	}
	out, _ = o.mustRun(cli.ExitOK, "jobs", "--state", "scheduled")
	if strings.Count(out, "due in ") != 2 {
		t.Fatalf("jobs --state scheduled:\n%s", out)
	}

	killed := time.Now()
	leader.signal(syscall.SIGKILL)
	<-leader.done
	servingSince(t, standby, killed)
	s.startWorker()
	for id, b := range before {
		// The near job may be due already on a loaded machine, and have run.
		early := time.Now().UnixMilli() < b.RunAtMillis
		out, _ := o.mustRun(cli.ExitOK, "status", id, "--json")
		if a := jsonJob(t, out); a.RunAtMillis != b.RunAtMillis || a.CreatedAtMillis != b.CreatedAtMillis || a.State.Terminal() && early {
			t.Fatalf("after the failover %+v, before %+v", a, b)
		}
	}
	// Resubmitted under its key, the far job is the same one.
	out, _ = o.mustRun(cli.ExitOK, "submit", "sha256", "--text", "far", "--in", "2h", "--idempotency-key", "far", "--json")
	if id := jsonJob(t, out).JobID; id != far {
		t.Fatalf("resubmitted under its key after the failover: %s, want %s", id, far)
	}
	var done protocol.Job
	eventually(t, "the near job completed", func() bool {
		out, _ := o.mustRun(cli.ExitOK, "status", near, "--json")
		done = jsonJob(t, out)
		return done.State.Terminal()
	})
	if done.State != protocol.StateCompleted || done.Attempts != 1 || done.UpdatedAtMillis < done.RunAtMillis {
		t.Fatalf("near job %+v, want COMPLETED once, not before it was due", done)
	}
	out, _ = o.mustRun(cli.ExitOK, "status", far, "--json")
	if j := jsonJob(t, out); j.State != protocol.StateScheduled {
		t.Fatalf("far job %+v, want SCHEDULED", j)
	}
}

// TestDelayedJobsSurviveServeSIGKILL: `jobbus serve` SIGKILLed while a near and a far
// delayed job wait, and started again on its store, holds both as they were: the near
// one runs once, when due, on its local worker; the far one (beyond the window: not
// read whole) stays SCHEDULED and keeps its key.
func TestDelayedJobsSurviveServeSIGKILL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	window := []string{"--schedule-window-millis", "1000"}
	p, url := serveProc(t, dir, window...)
	ctx := context.Background()
	cl := client.New(natsConnect(t, url))
	near, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "near"}, client.RunIn(4*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	far, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "far"}, client.RunIn(time.Hour), client.IdempotencyKey("far"))
	if err != nil {
		t.Fatal(err)
	}
	before := map[string]protocol.Job{}
	for _, id := range []string{near, far} {
		if before[id], err = cl.Status(ctx, id); err != nil || before[id].State != protocol.StateScheduled {
			t.Fatalf("status %+v, %v; want SCHEDULED", before[id], err)
		}
	}
	p.signal(syscall.SIGKILL)
	<-p.done

	_, url = serveProc(t, dir, append(window, "--workers", "1")...)
	cl = client.New(natsConnect(t, url))
	for id, b := range before {
		a, err := cl.Status(ctx, id)
		if err != nil || a.RunAtMillis != b.RunAtMillis || a.CreatedAtMillis != b.CreatedAtMillis || a.State.Terminal() {
			t.Fatalf("after the restart %+v (%v), before %+v", a, err, b)
		}
	}
	if id, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "far"}, client.RunIn(2*time.Hour), client.IdempotencyKey("far")); err != nil || id != far {
		t.Fatalf("resubmitted under its key after the restart: %s, %v; want %s", id, err, far)
	}
	var done protocol.Job
	eventually(t, "the near job completed", func() bool {
		done, err = cl.Status(ctx, near)
		return err == nil && done.State.Terminal()
	})
	if done.State != protocol.StateCompleted || done.Attempts != 1 || done.UpdatedAtMillis < done.RunAtMillis {
		t.Fatalf("near job %+v, want COMPLETED once, not before it was due", done)
	}
	if j, err := cl.Status(ctx, far); err != nil || j.State != protocol.StateScheduled {
		t.Fatalf("far job %+v, %v; want SCHEDULED", j, err)
	}
}

// TestCancelledScheduledJobIsNotDue: a delayed job cancelled before its time keeps the
// time it was due as information ("WAS DUE ... (not reached)", as the dashboard's
// "was due"), never as a pending "DUE ... (in 1h)"; the table shows its error.
func TestCancelledScheduledJobIsNotDue(t *testing.T) {
	t.Parallel()
	o := over{setup(t, noWorker()), natsTransport}
	id := strings.TrimSpace(first(o.mustRun(cli.ExitOK, "submit", "sha256", "--text", "later", "--in", "1h")))
	o.mustRun(cli.ExitOK, "cancel", id)
	out, _ := o.mustRun(cli.ExitOK, "status", id)
	if !strings.Contains(out, "CANCELLED") || strings.Contains(out, "\nDUE") || !strings.Contains(out, "WAS DUE") ||
		!strings.Contains(out, "(not reached)") || strings.Contains(out, "(in ") {
		t.Errorf("status of a cancelled delayed job:\n%s\nwant WAS DUE ... (not reached), no DUE", out)
	}
	out, _ = o.mustRun(cli.ExitOK, "jobs")
	if strings.Contains(out, "due ") {
		t.Errorf("jobs shows a cancelled job as due:\n%s", out)
	}
}
