package dashboard

import (
	"slices"
	"sort"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// storedJob is a coordinator's job record (bucket JOBS), the dashboard's source.
type storedJob = protocol.Record

// row is a job as the job table shows it.
type row struct {
	JobID       string            `json:"jobId"`
	TaskType    string            `json:"taskType"`
	State       protocol.State    `json:"state"`
	Attempts    int               `json:"attempts"`
	MaxAttempts int               `json:"maxAttempts"`
	Priority    protocol.Priority `json:"priority"`
	WorkerID    string            `json:"workerId,omitempty"` // running it, else the last to run it
	Error       string            `json:"error,omitempty"`
	CreatedAt   int64             `json:"createdAtMillis"`
	UpdatedAt   int64             `json:"updatedAtMillis"`
	RunAt       int64             `json:"runAtMillis,omitempty"` // a SCHEDULED job's due time
	seq         uint64
	history     []change
}

// change is one state change the dashboard saw, with the error the record carried.
type change struct {
	AtMillis int64          `json:"atMillis"`
	State    protocol.State `json:"state"`
	Attempts int            `json:"attempts"`
	WorkerID string         `json:"workerId,omitempty"`
	Error    string         `json:"error,omitempty"`
	RunAt    int64          `json:"runAtMillis,omitempty"` // SCHEDULED until then
	Snoozes  int            `json:"snoozes,omitempty"`     // the snoozes so far, when one made it SCHEDULED
}

// Bounds on what the index keeps per job.
const (
	maxRowError  = 300 // characters of the error in the table
	maxHistory   = 32  // changes kept per job
	bucketWidth  = 5 * time.Second
	buckets      = 120 // ten minutes of charts
	maxLatencies = 512 // samples per bucket for the percentiles
)

// bucket is bucketWidth of activity seen through the watch.
type bucket struct {
	start                                  int64 // unix seconds, a multiple of the width
	submitted, completed, failed, canceled int
	latencies                              []float64 // submit -> COMPLETED, milliseconds
}

// index is the dashboard's view of the jobs, fed by the KV watch. Guarded by
// Server.mu.
type index struct {
	jobs    map[string]*row
	order   []*row // by sequence, oldest first
	counts  map[protocol.State]int
	types   map[string]int
	version uint64 // bumped by every change
	loaded  bool   // the initial values have been read
	series  [buckets]bucket
}

func newIndex() *index {
	return &index{jobs: make(map[string]*row), counts: make(map[protocol.State]int), types: make(map[string]int)}
}

func clipText(s *string, n int) string {
	if s == nil {
		return ""
	}
	if len(*s) <= n {
		return *s
	}
	return (*s)[:n] + "…"
}

// apply takes one record; live is false while the initial values are read, which
// then do not count as activity.
func (x *index) apply(rec *storedJob, now time.Time, live bool) {
	x.version++
	r := x.jobs[rec.JobID]
	if r == nil {
		r = &row{JobID: rec.JobID, TaskType: rec.TaskType, seq: rec.Seq, CreatedAt: rec.CreatedAt}
		x.jobs[rec.JobID] = r
		x.insert(r)
		x.types[rec.TaskType]++
		if live {
			x.bucket(now).submitted++
		}
	} else {
		x.counts[r.State]--
	}
	changed := r.State != rec.State || r.Attempts != rec.Attempts
	r.State, r.Attempts, r.MaxAttempts, r.Priority = rec.State, rec.Attempts, rec.MaxAttempts, rec.Priority
	r.WorkerID = rec.LastWorkerID // the worker that ran it, once an attempt ended
	if rec.State == protocol.StateRunning {
		r.WorkerID = rec.WorkerID
	}
	r.Error = clipText(rec.Error, maxRowError)
	r.UpdatedAt = rec.UpdatedAt
	r.RunAt = 0
	if rec.State == protocol.StateScheduled {
		r.RunAt = rec.RunAt
	}
	x.counts[r.State]++
	if !changed {
		return
	}
	ch := change{AtMillis: rec.UpdatedAt, State: rec.State, Attempts: rec.Attempts, WorkerID: r.WorkerID, RunAt: r.RunAt}
	if r.RunAt != 0 {
		ch.Snoozes = rec.Snoozes
	}
	if rec.State == protocol.StateRetryWait || rec.State.Terminal() {
		// A queued or running record still carries the last attempt's error; the
		// history shows it where it arose.
		ch.Error = clipText(rec.Error, 4096)
	}
	r.history = append(r.history, ch)
	if len(r.history) > maxHistory {
		r.history = slices.Delete(r.history, 0, len(r.history)-maxHistory)
	}
	if !live {
		return
	}
	b := x.bucket(now)
	switch rec.State {
	case protocol.StateCompleted:
		b.completed++
		if len(b.latencies) < maxLatencies {
			b.latencies = append(b.latencies, float64(rec.UpdatedAt-rec.CreatedAt))
		}
	case protocol.StateFailed:
		b.failed++
	case protocol.StateCancelled:
		b.canceled++
	}
}

// remove forgets a deleted record.
func (x *index) remove(id string) {
	r := x.jobs[id]
	if r == nil {
		return
	}
	x.version++
	delete(x.jobs, id)
	x.counts[r.State]--
	if x.types[r.TaskType]--; x.types[r.TaskType] <= 0 {
		delete(x.types, r.TaskType)
	}
	i := sort.Search(len(x.order), func(i int) bool { return x.order[i].seq >= r.seq })
	for ; i < len(x.order) && x.order[i].seq == r.seq; i++ {
		if x.order[i] == r {
			x.order = slices.Delete(x.order, i, i+1)
			break
		}
	}
}

// insert keeps order sorted by sequence; new jobs usually go last.
func (x *index) insert(r *row) {
	if n := len(x.order); n == 0 || x.order[n-1].seq <= r.seq {
		x.order = append(x.order, r)
		return
	}
	i := sort.Search(len(x.order), func(i int) bool { return x.order[i].seq > r.seq })
	x.order = slices.Insert(x.order, i, r)
}

// bucket returns the chart bucket of now, clearing it if it held an older period.
func (x *index) bucket(now time.Time) *bucket {
	w := int64(bucketWidth / time.Second)
	start := now.Unix() / w * w
	b := &x.series[(start/w)%buckets]
	if b.start != start {
		*b = bucket{start: start, latencies: b.latencies[:0]}
	}
	return b
}

// page lists up to limit jobs newest first, below sequence before (0: from the
// newest), in state and of taskType ("" for any). next is the cursor of the following
// page, 0 at the end.
func (x *index) page(state protocol.State, taskType string, before uint64, limit int) (rows []row, next uint64) {
	i := len(x.order)
	if before > 0 {
		i = sort.Search(len(x.order), func(i int) bool { return x.order[i].seq >= before })
	}
	for i--; i >= 0; i-- {
		r := x.order[i]
		if (state != "" && r.State != state) || (taskType != "" && r.TaskType != taskType) {
			continue
		}
		if len(rows) == limit {
			return rows, rows[len(rows)-1].seq
		}
		rows = append(rows, *r)
	}
	return rows, 0
}

// point is one chart bucket, as the page draws it.
type point struct {
	AtMillis  int64   `json:"atMillis"`
	Submitted float64 `json:"submitted"` // per second
	Completed float64 `json:"completed"`
	Failed    float64 `json:"failed"`
	P50       float64 `json:"p50Millis"` // submit -> COMPLETED
	P95       float64 `json:"p95Millis"`
}

// chart returns the last ten minutes, oldest first, zeros where nothing happened.
func (x *index) chart(now time.Time) []point {
	w := int64(bucketWidth / time.Second)
	last := now.Unix() / w * w
	out := make([]point, 0, buckets)
	for start := last - (buckets-1)*w; start <= last; start += w {
		p := point{AtMillis: start * 1000}
		if b := &x.series[(start/w)%buckets]; b.start == start {
			secs := float64(w)
			p.Submitted, p.Completed, p.Failed = float64(b.submitted)/secs, float64(b.completed)/secs, float64(b.failed)/secs
			if n := len(b.latencies); n > 0 {
				l := slices.Clone(b.latencies)
				slices.Sort(l)
				p.P50, p.P95 = l[n/2], l[min(n-1, n*95/100)]
			}
		}
		out = append(out, p)
	}
	return out
}
