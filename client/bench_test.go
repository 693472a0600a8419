package client_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/frame"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// BenchmarkSubmitNATS is the client's cost of one submission over NATS, answered at
// once by a responder that decodes nothing: what the request id and the failover
// handling (client/failover.go) add to every submission.
//
//	go test -run '^$' -bench SubmitNATS -benchmem -count 5 ./client/
func BenchmarkSubmitNATS(b *testing.B) {
	nc := jobbustest.Start(b, jobbustest.WithoutCoordinator()).NC
	reply := mustEncode(&protocol.JobSubmitted{JobID: "job-1"})
	sub, err := nc.Subscribe(submitSubject, func(m *nats.Msg) { _ = m.Respond(reply) })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	c := client.New(nc)
	ctx := context.Background()
	payload := map[string]string{"text": "x"}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Submit(ctx, "SHA256", payload); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSubmitMany compares 64 jobs submitted by 64 Submit calls from 16
// goroutines with one SubmitMany of 64, on a real coordinator in the same process (no
// worker: the jobs stay queued). An op is 64 jobs; cpu-µs/job (the process's user and
// system time, coordinator and NATS server included) and allocs/job are per job.
//
//	go test -run '^$' -bench SubmitMany -benchtime 200x -count 5 ./client/
func BenchmarkSubmitMany(b *testing.B) {
	const jobs, submitters = 64, 16
	sys := jobbustest.Start(b, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) { c.MaxActiveJobs = 1 << 20 }))
	c := client.New(sys.NC)
	ctx := context.Background()
	payload := map[string]string{"text": "x"}
	subs := make([]client.Submission, jobs)
	for i := range subs {
		subs[i] = client.Submission{TaskType: "SHA256", Payload: payload}
	}
	run := map[string]func(b *testing.B){
		"Submit": func(b *testing.B) {
			var wg sync.WaitGroup
			var next atomic.Int64
			for range submitters {
				wg.Go(func() {
					for next.Add(1) <= jobs {
						if _, err := c.Submit(ctx, "SHA256", payload); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		},
		"SubmitMany": func(b *testing.B) {
			res, err := c.SubmitMany(ctx, subs)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range res {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		},
	}
	for _, name := range []string{"Submit", "SubmitMany"} {
		b.Run(name, func(b *testing.B) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			cpu := cpuTime()
			b.ResetTimer()
			for range b.N {
				run[name](b)
			}
			b.StopTimer()
			cpu = cpuTime() - cpu
			runtime.ReadMemStats(&after)
			n := float64(b.N * jobs)
			b.ReportMetric(float64(cpu.Microseconds())/n, "cpu-µs/job")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n, "allocs/job")
			b.ReportMetric(float64(b.Elapsed().Microseconds())/n, "µs/job")
		})
	}
}

// cpuTime is the process's user and system time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tcpBenchClient is a DialTCP client of a coordinator and bridge in this process that
// admits every job the benchmark submits.
func tcpBenchClient(b *testing.B) *client.Client {
	sys := jobbustest.Start(b, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) { c.MaxActiveJobs = 1 << 20 }))
	br := sys.StartBridge(b, func(c *bridge.Config) { c.WorkerListen = "" })
	c, err := client.DialTCP(context.Background(), br.ClientAddr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// BenchmarkTCPSubmit is the cost of a submission over the bridge's client port on one
// DialTCP client, against a real coordinator and bridge in the same process (no worker:
// the jobs stay queued). Sequential: one caller at a time. Parallel: b.RunParallel's
// goroutines share the client, so its connection carries their requests together.
//
//	go test -run '^$' -bench TCP -benchmem -count 5 ./client/
func BenchmarkTCPSubmit(b *testing.B) {
	c := tcpBenchClient(b)
	ctx := context.Background()
	payload := map[string]string{"text": "x"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Submit(ctx, "SHA256", payload); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTCPSubmitParallel is BenchmarkTCPSubmit with b.RunParallel's goroutines (8
// a core) sharing the client, so its connection can carry their requests together.
func BenchmarkTCPSubmitParallel(b *testing.B) {
	c := tcpBenchClient(b)
	ctx := context.Background()
	payload := map[string]string{"text": "x"}
	b.SetParallelism(8) // 8 callers a core: enough to keep a pipeline full
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Submit(ctx, "SHA256", payload); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkTCPStatusPeer isolates the client's side of the client port: Status calls
// on one DialTCP client against a peer in the same process that answers at once,
// without decoding, either each reply in a write of its own (as a lock-step bridge
// does) or the replies ready together in one write (as a pipelining bridge does).
//
//	go test -run '^$' -bench TCPStatusPeer -benchmem -count 5 ./client/
func BenchmarkTCPStatusPeer(b *testing.B) {
	for _, coalesce := range []bool{false, true} {
		for _, parallel := range []bool{false, true} {
			b.Run(fmt.Sprintf("coalesce=%v/parallel=%v", coalesce, parallel), func(b *testing.B) {
				addr := startEchoPeer(b, coalesce)
				c, err := client.DialTCP(context.Background(), addr)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				ctx := context.Background()
				b.ReportAllocs()
				if !parallel {
					for b.Loop() {
						if _, err := c.Status(ctx, "a"); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.SetParallelism(8)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := c.Status(ctx, "a"); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// startEchoPeer serves the client port on a raw listener until the benchmark ends,
// answering every request with the same JOB_STATUS.
func startEchoPeer(b *testing.B, coalesce bool) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	reply, _ := frame.Append(nil, mustEncode(&protocol.JobStatus{Job: protocol.Job{JobID: "a", State: protocol.StateQueued}}))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			wg.Go(func() {
				r := frame.NewReader(nc)
				var out []byte
				for {
					if _, err := r.Read(); err != nil {
						return
					}
					out = append(out, reply...)
					if coalesce && r.Started() { // more requests already here: answer them together
						continue
					}
					if _, err := nc.Write(out); err != nil {
						return
					}
					out = out[:0]
				}
			})
		}
	})
	b.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, nc := range conns {
			_ = nc.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}
