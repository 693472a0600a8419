package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
