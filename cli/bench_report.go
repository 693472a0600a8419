package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jobbus/jobbus/internal/version"
)

// dist summarises latencies as the peers' benchmarks do (nearest rank).
type dist struct {
	n                  int
	p50, p90, p99, max time.Duration
}

func newDist(v []time.Duration) dist {
	if len(v) == 0 {
		return dist{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return dist{n: len(s), p50: rank(0.50), p90: rank(0.90), p99: rank(0.99), max: s[len(s)-1]}
}

func (d dist) String() string {
	r := func(x time.Duration) time.Duration {
		if x >= 10*time.Millisecond {
			return x.Round(100 * time.Microsecond)
		}
		return x.Round(time.Microsecond)
	}
	return fmt.Sprintf("p50 %v, p90 %v, p99 %v, max %v", r(d.p50), r(d.p90), r(d.p99), r(d.max))
}

func (d dist) put(m map[string]float64, prefix string) {
	if d.n == 0 {
		return
	}
	for _, kv := range []struct {
		k string
		v time.Duration
	}{{"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}, {"max", d.max}} {
		m[prefix+"."+kv.k+"_ms"] = fracMillis(kv.v)
	}
}

func fracMillis(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// benchResult is what one throughput run measured.
type benchResult struct {
	jobs       int
	total      time.Duration // first submit to last completion
	submitted  time.Duration // first submit to the last submission answered
	firstStart time.Duration // first submit to the first start; 0 when not seen
	lastDone   time.Duration // first submit to the last completion (as total)
	submit     dist          // submit -> JOB_SUBMITTED
	start      dist          // submit -> the task started (in-process workers only)
	complete   dist          // submit -> COMPLETED stored (the coordinator's clock, ms)
	cpu        time.Duration // CPU time of this process over the run
	cpuWall    time.Duration // the run's wall time, until it was seen to be idle
	cpuOK      bool
	peakRSS    uint64 // the most this process held resident, from its start to the run's end (bytes)
	// allocs and allocBytes are this process's heap allocations over the run: unlike
	// time, they hardly depend on what else the machine runs.
	allocs, allocBytes uint64
	// messages is how many the in-process NATS server carried over the run, in and out
	// (0: not counted, for a system bench did not build).
	messages int64
}

// steady is the rate counted from the first start, as the peers' benchmarks report it.
func (r benchResult) steady() float64 {
	if r.firstStart <= 0 || r.lastDone <= r.firstStart || r.jobs < 2 {
		return 0
	}
	return float64(r.jobs-1) / (r.lastDone - r.firstStart).Seconds()
}

// idleResult is what the one-at-a-time run measured.
type idleResult struct {
	jobs                 int
	submit, start, total dist
}

// benchReport is the whole output: a text for people, or with --json one object in
// the shape of the peers' benchmark files ({"system","settings","metrics"}), so that
// their summarize tool reads jobbus's runs beside River's and Asynq's.
type benchReport struct {
	System   string             `json:"system"`
	Settings map[string]string  `json:"settings"`
	Metrics  map[string]float64 `json:"metrics"`

	run  *benchResult
	idle *idleResult
}

func newBenchReport(settings map[string]string, run *benchResult, idle *idleResult) *benchReport {
	settings["go"] = runtime.Version()
	settings["version"] = version.String()
	settings["gomaxprocs"] = strconv.Itoa(runtime.GOMAXPROCS(0))
	rep := &benchReport{System: "jobbus", Settings: settings, Metrics: map[string]float64{}, run: run, idle: idle}
	m := rep.Metrics
	if r := run; r != nil {
		m["e2e.seconds"] = r.total.Seconds()
		m["e2e.jobs_per_s"] = float64(r.jobs) / r.total.Seconds()
		m["e2e.enqueue_seconds"] = r.submitted.Seconds()
		if r.firstStart > 0 {
			m["e2e.first_start_ms"] = fracMillis(r.firstStart)
		}
		if s := r.steady(); s > 0 {
			m["e2e.jobs_per_s_after_first_start"] = s
		}
		r.submit.put(m, "e2e.enqueue_ack")
		r.start.put(m, "e2e.start")
		r.complete.put(m, "e2e.complete")
		m["e2e.allocs_per_job"] = float64(r.allocs) / float64(r.jobs)
		m["e2e.alloc_bytes_per_job"] = float64(r.allocBytes) / float64(r.jobs)
		if r.messages > 0 {
			m["e2e.nats_msgs_per_job"] = float64(r.messages) / float64(r.jobs)
		}
		if r.cpuOK {
			m["e2e.cpu_ms_per_job"] = fracMillis(r.cpu) / float64(r.jobs)
			m["e2e.cpu_self_cores"] = r.cpu.Seconds() / r.cpuWall.Seconds()
			m["e2e.peak_rss_mib"] = float64(r.peakRSS) / (1 << 20)
		}
	}
	if i := idle; i != nil {
		i.submit.put(m, "latency.enqueue_ack")
		i.start.put(m, "latency.start")
		i.total.put(m, "latency.complete")
	}
	return rep
}

func (rep *benchReport) writeJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(rep)
}

func (rep *benchReport) writeText(w io.Writer, inProcess bool) {
	if r := rep.run; r != nil {
		fmt.Fprintf(w, "%d jobs in %v: %.0f jobs/s (all submitted after %v)\n", r.jobs, r.total.Round(time.Millisecond),
			float64(r.jobs)/r.total.Seconds(), r.submitted.Round(time.Millisecond))
		if s := r.steady(); s > 0 {
			fmt.Fprintf(w, "steady rate %.0f jobs/s, counted from the first start (after %v)\n", s, r.firstStart.Round(10*time.Microsecond))
		}
		fmt.Fprintf(w, "submit latency p50 %v, p99 %v\n", r.submit.p50.Round(time.Microsecond), r.submit.p99.Round(time.Microsecond))
		if r.start.n > 0 {
			fmt.Fprintf(w, "submit -> start     %s\n", r.start)
		}
		if r.complete.n > 0 {
			fmt.Fprintf(w, "submit -> completed %s (ms resolution)\n", r.complete)
		}
		if r.cpuOK {
			whose := "this process: the client side only"
			if inProcess {
				whose = "the whole system, in-process"
			}
			fmt.Fprintf(w, "CPU %.2f s, %.3f ms per job, %.2f cores (%s)\n", r.cpu.Seconds(), fracMillis(r.cpu)/float64(r.jobs), r.cpu.Seconds()/r.cpuWall.Seconds(), whose)
			fmt.Fprintf(w, "peak RSS %.0f MiB (%s, since it started)\n", float64(r.peakRSS)/(1<<20), whose)
		}
		fmt.Fprintf(w, "heap allocations per job: %.0f, %.1f KiB\n", float64(r.allocs)/float64(r.jobs), float64(r.allocBytes)/float64(r.jobs)/1024)
		if r.messages > 0 {
			fmt.Fprintf(w, "NATS messages per job: %.1f (in and out of the embedded server)\n", float64(r.messages)/float64(r.jobs))
		}
	}
	if i := rep.idle; i != nil {
		fmt.Fprintf(w, "idle, %d jobs one at a time:\n", i.jobs)
		fmt.Fprintf(w, "  submit latency      %s\n", i.submit)
		if i.start.n > 0 {
			fmt.Fprintf(w, "  submit -> start     %s\n", i.start)
		}
		fmt.Fprintf(w, "  submit -> completed %s\n", i.total)
	}
}

// serverMessages counts the messages srv carried (received and delivered) so far.
func serverMessages(srv *server.Server) func() int64 {
	return func() int64 {
		v, err := srv.Varz(nil)
		if err != nil {
			return 0
		}
		return v.InMsgs + v.OutMsgs
	}
}

// countMessages is messages(), 0 when the system's server is not in-process.
func (bs *benchSystem) countMessages() int64 {
	if bs.messages == nil {
		return 0
	}
	return bs.messages()
}
