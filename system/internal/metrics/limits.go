package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The rate limits of the leading coordinator, read at scrape time: a limit's state
// lives in the leader's memory, so the throttled count starts again at a failover.
var (
	limitThrottledDesc = prometheus.NewDesc(namespace+"_limit_throttled_total",
		"Starts that waited for a rate limit's token, since the leading coordinator took the lead: per limit (scope type or queue, and name).",
		[]string{"scope", "name"}, nil)
	limitTokensDesc = prometheus.NewDesc(namespace+"_limit_tokens",
		"Tokens a rate limit's bucket holds now: starts that may follow at once.", []string{"scope", "name"}, nil)
	limitRateDesc = prometheus.NewDesc(namespace+"_limit_rate_per_second",
		"A rate limit's rate, in starts per second.", []string{"scope", "name"}, nil)
)

// limitCollector reads the leading coordinator's rate limits at scrape time.
type limitCollector struct{ m *Coordinator }

func (c *limitCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- limitThrottledDesc
	ch <- limitTokensDesc
	ch <- limitRateDesc
}

func (c *limitCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	cur := c.m.current
	c.m.mu.Unlock()
	if cur == nil {
		return
	}
	s := cur.Stats()
	if !s.Serving {
		return
	}
	for _, l := range s.Limits {
		ch <- prometheus.MustNewConstMetric(limitThrottledDesc, prometheus.CounterValue, float64(l.Throttled), l.Scope, l.Name)
		ch <- prometheus.MustNewConstMetric(limitTokensDesc, prometheus.GaugeValue, l.Tokens, l.Scope, l.Name)
		ch <- prometheus.MustNewConstMetric(limitRateDesc, prometheus.GaugeValue, l.PerSecond, l.Scope, l.Name)
	}
}
