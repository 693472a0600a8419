package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobbus/jobbus/coordinator"
)

// The schedules' metrics: each tick's outcome as it happens (ScheduleTicked, from the
// coordinator), and at scrape time, from the leading coordinator, how many ticks in a
// row each schedule's submission failed, so that a schedule whose task type or payload
// became invalid shows, and stays shown, until it succeeds again.

var scheduleFailuresDesc = prometheus.NewDesc(namespace+"_schedule_consecutive_failures",
	"Ticks in a row whose submission failed, by schedule (0 once one succeeds); the leading coordinator's.",
	[]string{"schedule"}, nil)

func newScheduleTicks() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "schedule_ticks_total",
		Help: "Schedule ticks by outcome: submitted (its job stored), failed (its submission refused: given up), retried (not stored for now: tried again), skipped (by the catch-up policy)."},
		[]string{"schedule", "outcome"})
}

// ScheduleTicked implements coordinator.ScheduleObserver.
func (m *Coordinator) ScheduleTicked(schedule string, o coordinator.ScheduleOutcome, n int) {
	m.schedTicks.WithLabelValues(schedule, string(o)).Add(float64(n))
}

// collectSchedules reads the leading coordinator's schedules at scrape time.
func collectSchedules(ch chan<- prometheus.Metric, c *coordinator.Coordinator) {
	for _, sc := range c.Schedules() {
		ch <- prometheus.MustNewConstMetric(scheduleFailuresDesc, prometheus.GaugeValue, float64(sc.Failures), sc.Name)
	}
}
