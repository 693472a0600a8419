package coordinator

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestMeasureWaitingMemory is issue 26's memory measure (JOBBUS_MEASURE=1): the heap a
// coordinator (memory store) holds for 10,000 QUEUED jobs against a 10,000-step chain
// (one QUEUED, 9,999 WAITING), less the bytes of the records the memory store holds
// (which JetStream holds in production), alternated, median of five.
func TestMeasureWaitingMemory(t *testing.T) {
	if os.Getenv("JOBBUS_MEASURE") == "" {
		t.Skip("a measurement: JOBBUS_MEASURE=1")
	}
	const n = protocol.MaxWorkflowSteps
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	stored := func(b *memBackend) (n uint64) {
		b.mu.Lock()
		defer b.mu.Unlock()
		for k, m := range b.records {
			n += uint64(len(m.data) + len(k))
		}
		for k, m := range b.controls {
			n += uint64(len(m.data) + len(k))
		}
		return n
	}
	measure := func(chain bool) (perJob, recordBytes float64) {
		b := newMemBackend()
		s := startMem(t, b, func(c *Config) { c.MaxActiveJobs = 2 * n })
		before := heap()
		if chain {
			req := &protocol.SubmitWorkflow{WorkflowID: "chain"}
			for i := range n {
				name := fmt.Sprintf("c%d", i)
				req.Steps = append(req.Steps, protocol.WorkflowStep{Name: name, TaskType: "SHA256", Payload: json.RawMessage(`{"text":"x"}`)})
				req.Chain = append(req.Chain, name)
			}
			got := make(chan protocol.Message, 1)
			s.sched.submitGroup(req, request{due: time.Minute}, func(m protocol.Message) { got <- answerOf(m) })
			if m, ok := (<-got).(*protocol.WorkflowSubmitted); !ok || len(m.Jobs) != n {
				t.Fatalf("chain not stored: %#v", m)
			}
			req = nil
		} else {
			for range n {
				s.accepted(sha("x"))
			}
		}
		after := heap()
		rb := stored(b)
		s.sched.mu.Lock()
		waiting, queued := 0, 0
		for _, j := range s.sched.jobs {
			switch j.rec.State {
			case protocol.StateWaiting:
				waiting++
			case protocol.StateQueued:
				queued++
			}
		}
		s.sched.mu.Unlock()
		if chain && (waiting != n-1 || queued != 1) || !chain && queued != n {
			t.Fatalf("chain %v: %d waiting, %d queued", chain, waiting, queued)
		}
		runtime.KeepAlive(s)
		return (float64(after) - float64(before) - float64(rb)) / n, float64(rb) / n
	}
	var q, c, qr, cr []float64
	for range 5 {
		a, ar := measure(false)
		b, br := measure(true)
		q, c, qr, cr = append(q, a), append(c, b), append(qr, ar), append(cr, br)
	}
	t.Logf("per job, coordinator heap less stored records (median of 5, alternated): QUEUED %.0f B, WAITING chain step %.0f B (ratio %.2f); record bytes per job %.0f vs %.0f; all: %v / %v",
		median(q), median(c), median(c)/median(q), median(qr), median(cr), q, c)
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}
