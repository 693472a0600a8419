package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestTCPWorkerGetsSingleAssignments: a spec TCP worker receives each assignment as
// its own TASK_ASSIGN frame, byte for byte the spec's, even when many go to it at once
// (jobs queued before it registers) and even when its WORKER_REGISTER claims it takes
// batches (the native extension): the bridge relays single assignments only, and the
// coordinator sends it nothing on task.assigns.
func TestTCPWorkerGetsSingleAssignments(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, register string }{
		{"spec", `{"type":"WORKER_REGISTER","workerId":"tcp-%s","capacity":8}`},
		{"claims batches", `{"type":"WORKER_REGISTER","workerId":"tcp-%s","capacity":8,"assigns":64}`},
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
			var single, batches atomic.Int64
			sub, err := s.NC.Subscribe("jobbus.node.worker.tcp-"+id+".>", func(m *nats.Msg) {
				switch {
				case strings.HasSuffix(m.Subject, "."+protocol.PathAssign):
					single.Add(1)
				case strings.HasSuffix(m.Subject, "."+protocol.PathAssigns):
					batches.Add(1)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			if err := s.NC.Flush(); err != nil {
				t.Fatal(err)
			}

			p := dial(t, s.br.WorkerAddr())
			if err := p.SendPayload(fmt.Appendf(nil, tc.register, id)); err != nil {
				t.Fatal(err)
			}
			if b, err := p.RecvRaw(); err != nil || string(b) != fmt.Sprintf(`{"type":"WORKER_REGISTERED","workerId":"tcp-%s"}`, id) {
				t.Fatalf("registration answered %s (%v)", b, err)
			}
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
				p.MustSend(&protocol.TaskResult{WorkerID: "tcp-" + id, JobID: a.JobID, AttemptID: a.AttemptID, Success: true, Result: ptr("done")})
				s.waitState(a.JobID, protocol.StateCompleted)
			}
			if b, one := batches.Load(), single.Load(); b != 0 || one != jobs {
				t.Fatalf("%d batch tells and %d single ones to the bridge, want %d single ones only", b, one, jobs)
			}
		})
	}
}
