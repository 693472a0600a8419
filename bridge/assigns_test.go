package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestTCPWorkerGetsBatchesAsSingleFrames: the bridge takes a spec TCP worker's
// assignments in batches (task.assigns), whatever its WORKER_REGISTER says, and the
// worker receives each assignment as its own TASK_ASSIGN frame, byte for byte the
// spec's, in the batch's order, even when many go to it at once (jobs queued before
// it registers, which the coordinator assigns in one batch).
func TestTCPWorkerGetsBatchesAsSingleFrames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, register string }{
		{"spec", `{"type":"WORKER_REGISTER","workerId":"tcp-%s","capacity":8}`},
		{"claims batches", `{"type":"WORKER_REGISTER","workerId":"tcp-%s","capacity":8,"assigns":2}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t)
			id := strings.ReplaceAll(tc.name, " ", "-")
			const jobs = 8
			ids := make(map[string]bool, jobs)
			for i := range jobs {
				jid, err := s.native.Submit(context.Background(), "SHA256", json.RawMessage(fmt.Sprintf(`{"text":"%d"}`, i)))
				if err != nil {
					t.Fatal(err)
				}
				ids[jid] = true
			}
			tells := sniffAssigns(t, s.NC, "tcp-"+id)

			p := dial(t, s.br.WorkerAddr())
			if err := p.SendPayload(fmt.Appendf(nil, tc.register, id)); err != nil {
				t.Fatal(err)
			}
			if b, err := p.RecvRaw(); err != nil || string(b) != fmt.Sprintf(`{"type":"WORKER_REGISTERED","workerId":"tcp-%s"}`, id) {
				t.Fatalf("registration answered %s (%v)", b, err)
			}
			var got []string // the jobs in the order of the frames
			for range jobs {
				b, err := p.RecvRaw()
				if err != nil {
					t.Fatal(err)
				}
				var a protocol.TaskAssign
				if err := json.Unmarshal(b, &a); err != nil || !ids[a.JobID] {
					t.Fatalf("frame %s (%v): want a TASK_ASSIGN of a job submitted, once", b, err)
				}
				delete(ids, a.JobID)
				want := fmt.Sprintf(`{"type":"TASK_ASSIGN","jobId":%q,"attemptId":%q,"attemptNumber":1,"taskType":"SHA256","payload":%s}`, a.JobID, a.AttemptID, a.Payload)
				if string(b) != want {
					t.Fatalf("frame %s, want the spec's TASK_ASSIGN %s", b, want)
				}
				got = append(got, a.JobID)
				p.MustSend(&protocol.TaskResult{WorkerID: "tcp-" + id, JobID: a.JobID, AttemptID: a.AttemptID, Success: true, Result: ptr("done")})
				s.waitState(a.JobID, protocol.StateCompleted)
			}
			// The tells reach this subscription on a connection of its own: it may see
			// the last ones after the worker got their frames.
			eventually(t, "every tell sniffed", func() bool { _, _, sent := tells.seen(); return len(sent) >= jobs })
			batches, singles, sent := tells.seen()
			if singles != 0 || len(sent) != jobs {
				t.Fatalf("%d single tells and batches of %v to the bridge (%d assignments), want %d assignments in batches only", singles, batches, len(sent), jobs)
			}
			if slices.Max(batches) < 2 {
				t.Fatalf("batches of %v assignments, want one of several", batches)
			}
			if !slices.Equal(got, sent) {
				t.Fatalf("frames in the order %v, want the batches' %v", got, sent)
			}
		})
	}
}

// assignTells is what a subscription saw of the coordinator's assignments to a worker.
type assignTells struct {
	mu      sync.Mutex
	batches []int    // the size of each task.assigns tell
	singles int      // task.assign tells
	jobs    []string // the jobs assigned, in order
}

// sniffAssigns records the assignments the coordinator tells worker id from now on.
func sniffAssigns(t *testing.T, nc *nats.Conn, id string) *assignTells {
	t.Helper()
	tells := &assignTells{}
	sub, err := nc.Subscribe("jobbus.node.worker."+id+".>", func(m *nats.Msg) {
		tells.mu.Lock()
		defer tells.mu.Unlock()
		switch {
		case strings.HasSuffix(m.Subject, "."+protocol.PathAssign):
			tells.singles++
			var a protocol.TaskAssign
			if err := json.Unmarshal(m.Data, &a); err != nil {
				t.Errorf("task.assign %s: %v", m.Data, err)
			}
			tells.jobs = append(tells.jobs, a.JobID)
		case strings.HasSuffix(m.Subject, "."+protocol.PathAssigns):
			var b protocol.TaskAssigns
			if err := json.Unmarshal(m.Data, &b); err != nil {
				t.Errorf("task.assigns %s: %v", m.Data, err)
			}
			tells.batches = append(tells.batches, len(b.Assigns))
			for _, a := range b.Assigns {
				tells.jobs = append(tells.jobs, a.JobID)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return tells
}

func (a *assignTells) seen() (batches []int, singles int, jobs []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.batches), a.singles, slices.Clone(a.jobs)
}
