package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/coordinator"
)

// Coordinator is the metrics of the coordinators a process runs: it is their
// coordinator.Observer (set it as Config.Observer) and, through OnLead, reads the one
// leading at scrape time for the gauges.
type Coordinator struct {
	submissions *prometheus.CounterVec
	assigned    *prometheus.CounterVec
	completed   *prometheus.CounterVec
	failed      *prometheus.CounterVec
	retried     *prometheus.CounterVec
	cancelled   *prometheus.CounterVec
	deadlines   *prometheus.CounterVec
	startLat    *prometheus.HistogramVec
	doneLat     *prometheus.HistogramVec
	writeLat    prometheus.Histogram
	writeErrs   prometheus.Counter
	writesPer   prometheus.Histogram
	syncLat     prometheus.Histogram
	syncWrites  prometheus.Histogram
	syncErrs    prometheus.Counter
	leads       prometheus.Counter
	workflows   *prometheus.CounterVec // workflows.go
	schedTicks  *prometheus.CounterVec // schedules.go

	// byType caches the series of each task type: the hot path then costs a map read.
	byType  sync.Map // string -> *typeSeries
	outcome map[coordinator.SubmitOutcome]prometheus.Counter

	mu      sync.Mutex
	current *coordinator.Coordinator // the one leading, or last led
	retired bus.Stats                // the bus counts of those that led before
}

type typeSeries struct {
	assigned, completed, failed, retried, cancelled, deadlines prometheus.Counter
	startLat, doneLat                                          prometheus.Observer
}

// latencyBuckets span a millisecond to ten minutes: trivial jobs to the task timeout.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// Coordinator returns the coordinator metrics, registering them on first use.
func (r *Registry) Coordinator() *Coordinator {
	if r.coord != nil {
		return r.coord
	}
	byType := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, []string{"task_type"})
	}
	m := &Coordinator{
		submissions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "submissions_total",
			Help: "Submissions by outcome: accepted, rejected (at capacity), invalid, duplicate (idempotency key already bound), failed (not stored), unknown (answered \"Outcome unknown\": may or may not be stored)."},
			[]string{"outcome"}),
		assigned:  byType("jobs_assigned_total", "Attempts started: jobs assigned to a worker."),
		completed: byType("jobs_completed_total", "Jobs that reached COMPLETED."),
		failed:    byType("jobs_failed_total", "Jobs that reached FAILED (no attempts left)."),
		retried:   byType("jobs_retried_total", "Attempts that ended badly with attempts left: jobs moved to RETRY_WAIT."),
		cancelled: byType("jobs_cancelled_total", "Jobs cancelled by a client."),
		deadlines: byType("deadline_expiries_total", "Attempts that overran the execution deadline."),
		startLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "job_start_latency_seconds",
			Help: "Time from submission to the start of the first attempt.", Buckets: latencyBuckets}, []string{"task_type"}),
		doneLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "job_completion_latency_seconds",
			Help: "Time from submission to COMPLETED.", Buckets: latencyBuckets}, []string{"task_type"}),
		writeLat: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "kv_write_duration_seconds",
			Help:    "Latency of job record writes to JetStream KV.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5}}),
		writeErrs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "kv_write_errors_total",
			Help: "Job record writes that failed (retried, fenced or given up)."}),
		writesPer: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "kv_writes_per_job",
			Help:    "KV writes a coordinator spent on a job, observed when its final state is stored.",
			Buckets: []float64{1, 2, 3, 4, 5, 6, 8, 10, 15, 20}}),
		syncLat: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "store_sync_duration_seconds",
			Help:    "Latency of the coordinator's fsyncs of the job store (serve --sync always on a lone server).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}}),
		syncWrites: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "store_sync_writes",
			Help:    "Job writes one fsync of the job store made durable (group commit).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}}),
		syncErrs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "store_sync_errors_total",
			Help: "Fsyncs of the job store that failed: job writes wait, and submissions are refused, until one succeeds."}),
		leads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "leader_changes_total",
			Help: "Times a coordinator of this process took the lead."}),
		schedTicks: newScheduleTicks(),
	}
	m.workflows = newWorkflows()
	m.outcome = make(map[coordinator.SubmitOutcome]prometheus.Counter)
	for _, o := range []coordinator.SubmitOutcome{coordinator.SubmitAccepted, coordinator.SubmitRejected,
		coordinator.SubmitInvalid, coordinator.SubmitDuplicate, coordinator.SubmitFailed, coordinator.SubmitUnknown} {
		m.outcome[o] = m.submissions.WithLabelValues(string(o))
	}
	r.reg.MustRegister(m.submissions, m.assigned, m.completed, m.failed, m.retried, m.cancelled, m.deadlines,
		m.startLat, m.doneLat, m.writeLat, m.writeErrs, m.writesPer, m.syncLat, m.syncWrites, m.syncErrs, m.leads, m.workflows,
		&coordinatorCollector{m}, m.schedTicks)
	r.AddBus("coordinator", m.busStats)
	r.coord = m
	return m
}

// busStats sums the bus counts of every coordinator this process ran.
func (m *Coordinator) busStats() bus.Stats {
	m.mu.Lock()
	cur := m.current
	var s bus.Stats
	s.Add(m.retired)
	m.mu.Unlock()
	if cur != nil {
		s.Add(cur.Stats().Bus)
	}
	return s
}

func (m *Coordinator) series(taskType string) *typeSeries {
	if s, ok := m.byType.Load(taskType); ok {
		return s.(*typeSeries)
	}
	s := &typeSeries{
		assigned: m.assigned.WithLabelValues(taskType), completed: m.completed.WithLabelValues(taskType),
		failed: m.failed.WithLabelValues(taskType), retried: m.retried.WithLabelValues(taskType),
		cancelled: m.cancelled.WithLabelValues(taskType), deadlines: m.deadlines.WithLabelValues(taskType),
		startLat: m.startLat.WithLabelValues(taskType), doneLat: m.doneLat.WithLabelValues(taskType),
	}
	actual, _ := m.byType.LoadOrStore(taskType, s)
	return actual.(*typeSeries)
}

// Submitted implements coordinator.Observer.
func (m *Coordinator) Submitted(o coordinator.SubmitOutcome) {
	if c := m.outcome[o]; c != nil {
		c.Inc()
	}
}

// JobChanged implements coordinator.Observer.
func (m *Coordinator) JobChanged(ch coordinator.JobChange) {
	s := m.series(ch.TaskType)
	switch ch.To {
	case protocol.StateRunning:
		s.assigned.Inc()
		if ch.Attempts == 1 {
			s.startLat.Observe(ch.At.Sub(ch.Created).Seconds())
		}
	case protocol.StateCompleted:
		s.completed.Inc()
		s.doneLat.Observe(ch.At.Sub(ch.Created).Seconds())
	case protocol.StateFailed:
		s.failed.Inc()
	case protocol.StateRetryWait:
		s.retried.Inc()
	case protocol.StateCancelled:
		s.cancelled.Inc()
	}
}

// DeadlineExpired implements coordinator.Observer.
func (m *Coordinator) DeadlineExpired(taskType string) { m.series(taskType).deadlines.Inc() }

// Stored implements coordinator.Observer.
func (m *Coordinator) Stored(took time.Duration, err error, terminal bool, writes int) {
	if err != nil {
		m.writeErrs.Inc()
		return
	}
	m.writeLat.Observe(took.Seconds())
	if terminal {
		m.writesPer.Observe(float64(writes))
	}
}

// Synced implements coordinator.Observer.
func (m *Coordinator) Synced(took time.Duration, writes int, err error) {
	if err != nil {
		m.syncErrs.Inc()
		return
	}
	m.syncLat.Observe(took.Seconds())
	m.syncWrites.Observe(float64(writes))
}

// OnLead is coordinator.Run's onLead: it counts a leader change and reads c at
// scrape time from now on.
func (m *Coordinator) OnLead(c *coordinator.Coordinator) {
	m.leads.Inc()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.current != nil && m.current != c {
		m.retired.Add(m.current.Stats().Bus)
	}
	m.current = c
}

var (
	jobsDesc = prometheus.NewDesc(namespace+"_jobs",
		"Jobs the leading coordinator holds, by state.", []string{"state"}, nil)
	workersDesc = prometheus.NewDesc(namespace+"_workers",
		"Live workers registered with the leading coordinator.", nil, nil)
	capacityDesc = prometheus.NewDesc(namespace+"_worker_capacity_slots",
		"Slots of the live workers: jobs they may run at once.", nil, nil)
	busyDesc = prometheus.NewDesc(namespace+"_worker_busy_slots",
		"Slots of the live workers in use: attempts running.", nil, nil)
	leadingDesc = prometheus.NewDesc(namespace+"_coordinator_leading",
		"1 while a coordinator of this process leads and serves, else 0.", nil, nil)
	queueDepthDesc = prometheus.NewDesc(namespace+"_queue_depth",
		"QUEUED jobs of each named queue.", []string{"queue"}, nil)
	queueRunningDesc = prometheus.NewDesc(namespace+"_queue_running",
		"RUNNING jobs of each named queue.", []string{"queue"}, nil)
	queuePausedDesc = prometheus.NewDesc(namespace+"_queue_paused",
		"1 while the queue is paused (it accepts jobs and starts none), else 0.", []string{"queue"}, nil)
	queueLatencyDesc = prometheus.NewDesc(namespace+"_queue_latency_seconds",
		"How long the queue's oldest QUEUED job has waited; 0 when none waits.", []string{"queue"}, nil)
	queueStartedDesc = prometheus.NewDesc(namespace+"_queue_started_total",
		"Attempts the leading coordinator started from each queue since it took the lead.", []string{"queue"}, nil)
	queueThrottledDesc = prometheus.NewDesc(namespace+"_queue_throttled_total",
		"Dispatch passes of the leading coordinator in which a limit (rate limit, max running) held the queue's next job back.", []string{"queue"}, nil)
)

// coordinatorCollector reads the leading coordinator's Stats at scrape time.
type coordinatorCollector struct{ m *Coordinator }

func (c *coordinatorCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{jobsDesc, workersDesc, capacityDesc, busyDesc, leadingDesc, scheduleFailuresDesc,
		queueDepthDesc, queueRunningDesc, queuePausedDesc, queueLatencyDesc, queueStartedDesc, queueThrottledDesc} {
		ch <- d
	}
}

func (c *coordinatorCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	cur := c.m.current
	c.m.mu.Unlock()
	leading := 0.0
	if cur != nil {
		if s := cur.Stats(); s.Serving {
			leading = 1
			for _, st := range protocol.States {
				ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, float64(s.Jobs[st]), string(st))
			}
			var capacity, busy int
			for _, w := range s.Workers {
				capacity += w.Capacity
				busy += w.ActiveTasks
			}
			ch <- prometheus.MustNewConstMetric(workersDesc, prometheus.GaugeValue, float64(len(s.Workers)))
			ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(capacity))
			ch <- prometheus.MustNewConstMetric(busyDesc, prometheus.GaugeValue, float64(busy))
			collectSchedules(ch, cur) // schedules.go
			collectQueues(ch, s.Queues)
		}
	}
	ch <- prometheus.MustNewConstMetric(leadingDesc, prometheus.GaugeValue, leading)
}

// collectQueues writes the series of each named queue.
func collectQueues(ch chan<- prometheus.Metric, qs []protocol.QueueInfo) {
	for _, q := range qs {
		paused := 0.0
		if q.Paused {
			paused = 1
		}
		ch <- prometheus.MustNewConstMetric(queueDepthDesc, prometheus.GaugeValue, float64(q.Queued), q.Name)
		ch <- prometheus.MustNewConstMetric(queueRunningDesc, prometheus.GaugeValue, float64(q.Running), q.Name)
		ch <- prometheus.MustNewConstMetric(queuePausedDesc, prometheus.GaugeValue, paused, q.Name)
		ch <- prometheus.MustNewConstMetric(queueLatencyDesc, prometheus.GaugeValue, float64(q.LatencyMillis)/1000, q.Name)
		ch <- prometheus.MustNewConstMetric(queueStartedDesc, prometheus.CounterValue, float64(q.Started), q.Name)
		ch <- prometheus.MustNewConstMetric(queueThrottledDesc, prometheus.CounterValue, float64(q.Throttled), q.Name)
	}
}
