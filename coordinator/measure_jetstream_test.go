package coordinator_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
)

// TestMeasureWaitingMemoryJetStream is TestMeasureWaitingMemory over JetStream
// (JOBBUS_MEASURE=1): the heap of the whole process (coordinator, embedded NATS
// server, client) after a forced GC, 10,000 QUEUED jobs against a 10,000-step chain.
func TestMeasureWaitingMemoryJetStream(t *testing.T) {
	if os.Getenv("JOBBUS_MEASURE") == "" {
		t.Skip("a measurement: JOBBUS_MEASURE=1")
	}
	const n = 10_000
	heap := func() uint64 {
		var m runtime.MemStats
		time.Sleep(500 * time.Millisecond)
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	run := func(chain bool) float64 {
		s := setup(t, func(c *coordinator.Config) { c.MaxActiveJobs = 3 * n })
		cl := client.New(s.NC, client.WithTimeout(time.Minute))
		ctx := context.Background()
		before := heap()
		if chain {
			w := client.NewWorkflow("chain")
			var names []string
			for i := range n {
				names = append(names, fmt.Sprintf("c%d", i))
				w.Step(names[i], "SHA256", map[string]string{"text": "x"})
			}
			w.Chain(names...)
			if _, err := cl.SubmitWorkflow(ctx, w); err != nil {
				t.Fatal(err)
			}
		} else {
			var wg sync.WaitGroup
			var next atomic.Int64
			for range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := next.Add(1); i <= n; i = next.Add(1) {
						if _, err := cl.Submit(ctx, "SHA256", map[string]string{"text": "x"}); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		}
		after := heap()
		s.RestartCoordinator(t) // nothing: keeps s alive until measured
		return (float64(after) - float64(before)) / n
	}
	var q, c []float64
	for range 3 {
		q = append(q, run(false))
		c = append(c, run(true))
	}
	t.Logf("process heap per job after GC (JetStream, embedded server): QUEUED %v, WAITING chain step %v", q, c)
}
