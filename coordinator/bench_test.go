package coordinator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
)

// BenchmarkThroughput runs b.N trivial SHA256 jobs end to end (submit, assign, execute,
// durable result) through 4 native workers of capacity 64, from 64 concurrent
// submitters, and reports jobs/s.
//
//	go test -run '^$' -bench Throughput -benchtime 20000x -count 5 ./coordinator/
func BenchmarkThroughput(b *testing.B) {
	s := setupBench(b)
	for range 4 {
		startWorkerB(s, b, worker.WithCapacity(64))
	}
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if _, err := s.Client.Submit(ctx, "SHA256", text("x")); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	testkit.Eventually(b, 5*time.Minute, "all jobs done", func() bool {
		for _, st := range []protocol.State{protocol.StateQueued, protocol.StateRunning, protocol.StateRetryWait} {
			page, err := s.Client.List(ctx, protocol.ListJobs{State: &st, Limit: 1})
			if err != nil || len(page.Jobs) > 0 {
				return false
			}
		}
		return true
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
}

// BenchmarkSubmitToAssign measures, on an idle system, the time from sending a
// submission to the worker receiving its TASK_ASSIGN, and reports p50 and p99.
func BenchmarkSubmitToAssign(b *testing.B) {
	s := setupBench(b)
	m := s.ManualWorker("probe", 1)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		go func() {
			if _, err := s.Client.Submit(ctx, "SHA256", text("x")); err != nil {
				b.Error(err)
			}
		}()
		a := s.NextAssign(m)
		lat = append(lat, time.Since(start))
		s.Accept(m, a, true, "ok")
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func setupBench(b *testing.B) *system {
	s := setup(b, func(c *coordinator.Config) { c.MaxActiveJobs = 1 << 30; c.HeartbeatTimeout = time.Minute })
	return s
}

func startWorkerB(s *system, b *testing.B, opts ...worker.Option) {
	w, _ := s.StartNativeWorker(b, opts...)
	testkit.Eventually(b, 10*time.Second, fmt.Sprintf("worker %s registered", w.ID()), func() bool { return s.HasWorker(w.ID()) })
}

// BenchmarkSubmitMany submits 64 jobs per op, on a system without workers (the jobs stay
// queued), either as 64 SUBMIT_JOBs in flight at once or as one SUBMIT_JOBS of 64, and
// waits for every answer. It reports allocations and time per job: the whole process's
// (client, coordinator, embedded NATS server, JetStream), as -benchmem counts them.
//
//	go test -run '^$' -bench SubmitMany -benchmem -benchtime 200x -count 5 ./coordinator/
func BenchmarkSubmitMany(b *testing.B) {
	const n = 64
	e1, _ := protocol.EndpointFor(protocol.TypeSubmitJob)
	en, _ := protocol.EndpointFor(protocol.TypeSubmitJobs)
	body, err := protocol.Encode(&protocol.SubmitJob{TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`)})
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"Singles", "Batch"} {
		b.Run(mode, func(b *testing.B) {
			s := setupBench(b)
			inbox := s.NC.NewRespInbox()
			replies := make(chan *nats.Msg, 2*n)
			sub, err := s.NC.ChanSubscribe(inbox+".*", replies)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			send := func(subject string, data []byte, rid string) {
				m := &nats.Msg{Subject: subject, Reply: inbox + "." + rid, Data: data, Header: nats.Header{}}
				m.Header.Set(protocol.HeaderRequestID, rid)
				m.Header.Set(protocol.HeaderRequestTry, protocol.TryValue(1))
				if err := s.NC.PublishMsg(m); err != nil {
					b.Fatal(err)
				}
			}
			await := func(k int) {
				for range k {
					select {
					case m := <-replies:
						if bytes.Contains(m.Data, []byte(`"ERROR"`)) || bytes.Contains(m.Data, []byte(`"SUBMIT_REJECTED"`)) {
							b.Fatalf("reply %s", m.Data)
						}
					case <-time.After(30 * time.Second):
						b.Fatal("no reply")
					}
				}
			}
			rids := make([]string, n)
			batch := protocol.SubmitJobs{Jobs: make([]protocol.BatchedSubmission, n)}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := processCPU(b)
			for range b.N {
				for i := range rids {
					rids[i] = protocol.NewRequestID()
				}
				if mode == "Singles" {
					for _, rid := range rids {
						send(e1.Subject(), body, rid)
					}
					await(n)
					continue
				}
				for i, rid := range rids {
					batch.Jobs[i] = protocol.BatchedSubmission{RequestID: rid, Submit: body}
				}
				data, err := protocol.Encode(&batch)
				if err != nil {
					b.Fatal(err)
				}
				send(en.Subject(), data, protocol.NewRequestID())
				await(1)
			}
			b.StopTimer()
			b.ReportMetric(float64((processCPU(b)-cpu).Microseconds())/float64(b.N*n), "cpu-µs/job")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/job")
			b.ReportMetric(float64(n), "jobs/op") // -benchmem's figures are per op: per 64 jobs
		})
	}
}

// processCPU is the CPU time (user and system) this process has used so far: the
// client's, the coordinator's and the embedded server's together.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
