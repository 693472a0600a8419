package cli_test

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// TestServeSIGKILLAsParentsEnd: jobbus serve SIGKILLed just as a parent job completed,
// while its children are being released, a batch's jobs run, a delayed job and its
// child wait, and a queue capped at one running job has jobs waiting; started again on
// its store, with the recording worker outside it still running what it holds. Every
// job completes, each executed exactly once (a restart costs a running job nothing),
// no child starts before each of its parents ended, the batch's callbacks run once
// after all its jobs, the delayed job not before its due time, and the capped queue
// never runs two at once.
func TestServeSIGKILLAsParentsEnd(t *testing.T) {
	t.Parallel()
	dir, record := t.TempDir(), filepath.Join(t.TempDir(), "record")
	port := freePorts(t, 1)[0]
	url := "nats://" + hostPort(port)
	startServe := func() *proc {
		p := startProc(t, nil, "serve", "--data-dir", dir, "--nats-listen", hostPort(port), "--worker-port", "-1",
			"--client-port", "-1", "--http-listen", "-", "--heartbeat-timeout-millis", "2000")
		p.logged(`msg="coordinator serving"`)
		return p
	}
	serve := startServe()
	startRecordingWorker(t, url, "recorder", record, recorderQueuesEnv+"=default,one")
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl := client.New(nc, client.WithTimeout(10*time.Second))
	ctx := context.Background()
	eventually(t, "the recording worker listed", func() bool {
		ws, err := cl.Workers(ctx)
		return err == nil && len(ws) == 1
	})
	if _, err := cl.SetQueue(ctx, "one", client.MaxRunning(1)); err != nil {
		t.Fatal(err)
	}

	keys := map[string]string{}      // job id -> key
	parents := map[string][]string{} // key -> its parents' keys
	submit := func(key string, millis int, opts ...client.SubmitOption) string {
		t.Helper()
		id, err := cl.Submit(ctx, "RECORDED", recorded{Key: key, Millis: millis}, opts...)
		if err != nil {
			t.Fatalf("submit %s: %v", key, err)
		}
		keys[id] = key
		return id
	}
	after := func(key string, millis int, ps ...string) {
		t.Helper()
		ids := make([]string, len(ps))
		for i, p := range ps {
			ids[i] = idOf(keys, p)
		}
		submit(key, millis, client.After(ids...))
		parents[key] = ps
	}
	p := submit("p", 500)
	after("c1", 300, "p")
	after("c2", 300, "p")
	after("g", 100, "c1", "c2")
	b := client.NewBatch("b").
		OnSuccess("RECORDED", recorded{Key: "b-success", Millis: 50}).
		OnComplete("RECORDED", recorded{Key: "b-complete", Millis: 50})
	batch := []string{"b0", "b1", "b2"}
	for i, k := range batch {
		b.Step(k, "RECORDED", recorded{Key: k, Millis: 300 + 300*i})
	}
	sub, err := cl.SubmitWorkflow(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	for step, id := range sub.Jobs {
		switch step {
		case protocol.StepOnSuccess, protocol.StepOnComplete:
			keys[id] = "b-" + step[3:]
			parents["b-"+step[3:]] = batch
		default:
			keys[id] = step
		}
	}
	d := submit("d", 100, client.RunIn(1500*time.Millisecond))
	after("dc", 100, "d")
	var capped []string
	for _, k := range []string{"q0", "q1", "q2"} {
		submit(k, 400, client.Queue("one"))
		capped = append(capped, k)
	}

	eventually(t, "the first parent completed", func() bool {
		j, err := cl.Status(ctx, p)
		return err == nil && j.State.Terminal()
	})
	serve.signal(syscall.SIGKILL) // its children are being released, or just were
	<-serve.done
	startServe() // the same store; startProc's cleanup stops it

	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for id, key := range keys {
		j, err := cl.Wait(wctx, id)
		if err != nil {
			t.Fatalf("job %s (%s): %v", id, key, err)
		}
		if j.State != protocol.StateCompleted || j.Attempts != 1 {
			t.Errorf("job %s (%s) ended %s after %d attempts: %s", id, key, j.State, j.Attempts, deref(j.Error))
		}
	}
	execs := readRecord(t, record)
	for _, key := range keys {
		if es := execs[key]; len(es) != 1 || es[0].end == 0 {
			t.Errorf("%s executed %d times: %+v, want once, to its end", key, len(es), es)
		}
	}
	for key, ps := range parents {
		for _, p := range ps {
			if len(execs[key]) > 0 && len(execs[p]) > 0 && execs[key][0].start < execs[p][len(execs[p])-1].end {
				t.Errorf("%s started %v before its parent %s ended", key,
					time.Duration(execs[p][len(execs[p])-1].end-execs[key][0].start), p)
			}
		}
	}
	if j, err := cl.Status(ctx, d); err != nil || len(execs["d"]) == 0 || execs["d"][0].start < j.RunAtMillis*int64(time.Millisecond) {
		t.Errorf("delayed job %+v (%v) started at %+v, before its due time", j, err, execs["d"])
	}
	var q []execution
	for _, k := range capped {
		q = append(q, execs[k]...)
	}
	if n := overlaps(q); n > 0 {
		t.Errorf("the queue capped at one running job ran two at once %d times: %+v", n, q)
	}
}

// idOf is the job id of key in keys (job id -> key).
func idOf(keys map[string]string, key string) string {
	for id, k := range keys {
		if k == key {
			return id
		}
	}
	return ""
}
