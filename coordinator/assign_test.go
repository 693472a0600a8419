package coordinator_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestAssignedAtOnce: a job submitted while a worker has a free slot and nothing waits
// is stored once, already RUNNING (a write less than queueing it first), and runs; one
// submitted while the only slot is busy is stored QUEUED first, as any job was.
func TestAssignedAtOnce(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.StartWorker(1)
	var mu sync.Mutex
	stored := map[string][]string{} // job id: the states of its records, in the order stored
	sub, err := s.NC.Subscribe("$KV."+protocol.JobsBucket+".*", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		id := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		stored[id] = append(stored[id], m.Header.Get(protocol.HeaderState))
	})
	must(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	must(t, s.NC.Flush())

	ctx := context.Background()
	first, err := s.Client.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 300})
	must(t, err)
	second, err := s.Client.Submit(ctx, "SHA256", text("queued behind the first"))
	must(t, err)
	for _, id := range []string{first, second} {
		if j := s.Wait(id); j.State != protocol.StateCompleted || j.Attempts != 1 {
			t.Fatalf("job %+v, want COMPLETED on attempt 1", j)
		}
	}
	states := func(id string) []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(stored[id])
	}
	testkit.Eventually(t, 5*time.Second, "both jobs' COMPLETED records", func() bool {
		a, b := states(first), states(second)
		return len(a) > 0 && a[len(a)-1] == "COMPLETED" && len(b) > 0 && b[len(b)-1] == "COMPLETED"
	})
	if got := states(first); !slices.Equal(got, []string{"RUNNING", "COMPLETED"}) {
		t.Errorf("the job a free worker took was stored as %v, want [RUNNING COMPLETED]", got)
	}
	if got := states(second); got[0] != "QUEUED" {
		t.Errorf("the job that waited for the busy slot was stored as %v, want QUEUED first", got)
	}
}
