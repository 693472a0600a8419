package coordinator

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// walkCounts counts the jobs by state walking every entry, as jobCounts did.
func walkCounts(x *jobIndex) map[protocol.State]int {
	n := make(map[protocol.State]int)
	for i := range x.entries {
		switch e := &x.entries[i]; {
		case e.j != nil:
			n[e.j.rec.State]++
		case e.live():
			n[e.state()]++
		}
	}
	return n
}

// TestJobCountsWithoutAWalk: through submissions, state changes, retirements, jobs
// dropped unstored, finished jobs restored by their entry alone, expiry and the
// index's compaction, countJobs says what a walk of every entry says.
func TestJobCountsWithoutAWalk(t *testing.T) {
	t.Parallel()
	cfg := &Config{Retention: time.Minute}
	rt := &retention{cfg: cfg, doneKeys: make(map[string]doneKey)}
	jobs := make(map[string]*job)
	var seq uint64
	now := time.UnixMilli(1_790_000_000_000)
	rng := rand.New(rand.NewPCG(29, 1))
	pick := func() *job { // some active job, or nil
		for _, j := range jobs {
			return j
		}
		return nil
	}
	ends := []protocol.State{protocol.StateCompleted, protocol.StateFailed, protocol.StateCancelled}
	for step := range 20000 {
		now = now.Add(time.Duration(rng.IntN(20)) * time.Millisecond)
		switch op := rng.IntN(10); {
		case op < 3: // a submission
			seq++
			j := &job{rec: protocol.Record{JobID: fmt.Sprintf("job-%d", seq), Seq: seq, State: protocol.StateQueued}}
			jobs[j.rec.JobID] = j
			rt.index.add(seq, j.rec.JobID, j.rec.State, "", j)
		case op < 5: // a state change of an active job
			if j := pick(); j != nil {
				j.rec.State = []protocol.State{protocol.StateRunning, protocol.StateRetryWait, protocol.StateQueued}[rng.IntN(3)]
			}
		case op < 8: // a job ends and retires once its record is durable
			if j := pick(); j != nil {
				j.rec.State, j.rec.EndedAt = ends[rng.IntN(3)], now.UnixMilli()
				delete(jobs, j.rec.JobID)
				rt.retire(j)
			}
		case op < 9: // a create never stored is dropped
			if j := pick(); j != nil {
				delete(jobs, j.rec.JobID)
				rt.index.remove(j.rec.Seq)
			}
		default: // a finished job restored by its entry alone (recovery)
			seq++
			rt.index.add(seq, newID(), ends[rng.IntN(3)], "", nil)
		}
		if step%50 == 0 {
			rt.expire(now)
		}
		if step%10 != 0 {
			continue
		}
		if got, want := countJobs(&rt.index, jobs), walkCounts(&rt.index); !maps.Equal(got, want) {
			t.Fatalf("step %d: countJobs %v, a walk %v", step, got, want)
		}
	}
	if uint64(len(rt.index.entries)) >= seq {
		t.Fatalf("%d entries of %d jobs: the index was never compacted", len(rt.index.entries), seq)
	}
	rt.expire(now.Add(time.Hour)) // every finished job expires
	if got, want := countJobs(&rt.index, jobs), walkCounts(&rt.index); !maps.Equal(got, want) {
		t.Fatalf("after expiry: countJobs %v, a walk %v", got, want)
	}
}

// BenchmarkJobCounts: the counts of a coordinator keeping a million finished jobs and
// 10,000 active ones, with and without a walk of every entry.
func BenchmarkJobCounts(b *testing.B) {
	var x jobIndex
	jobs := make(map[string]*job)
	for seq := uint64(1); seq <= 1_010_000; seq++ {
		if seq <= 1_000_000 {
			x.add(seq, newID(), protocol.StateCompleted, "", nil)
			continue
		}
		j := &job{rec: protocol.Record{JobID: newID(), Seq: seq, State: protocol.StateQueued}}
		jobs[j.rec.JobID] = j
		x.add(seq, j.rec.JobID, j.rec.State, "", j)
	}
	b.Run("countJobs", func(b *testing.B) {
		for b.Loop() {
			countJobs(&x, jobs)
		}
	})
	b.Run("walk", func(b *testing.B) {
		for b.Loop() {
			walkCounts(&x)
		}
	})
}
