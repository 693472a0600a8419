package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobbus/jobbus/bridge"
)

var (
	bridgeConns = prometheus.NewDesc(namespace+"_bridge_connections",
		"Open TCP connections by port (worker, client).", []string{"port"}, nil)
	bridgeAccepted = prometheus.NewDesc(namespace+"_bridge_connections_accepted_total",
		"TCP connections accepted by port, refused ones included.", []string{"port"}, nil)
	bridgeRefused = prometheus.NewDesc(namespace+"_bridge_connections_refused_total",
		"TCP connections refused at the connection limit, by port.", []string{"port"}, nil)
	bridgeFrameErrors = prometheus.NewDesc(namespace+"_bridge_frame_errors_total",
		"Connections ended by a bad frame, by port and reason (bad_length, stalled, malformed).", []string{"port", "reason"}, nil)
	bridgeResults = prometheus.NewDesc(namespace+"_bridge_results_total",
		"TCP workers' results whose delivery to the coordinator ended, by outcome (answered, refused, abandoned).", []string{"outcome"}, nil)
)

// bridgeCollector reads bridge.Stats at scrape time.
type bridgeCollector struct{ b *bridge.Bridge }

func (c *bridgeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- bridgeConns
	ch <- bridgeAccepted
	ch <- bridgeRefused
	ch <- bridgeFrameErrors
	ch <- bridgeResults
}

func (c *bridgeCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.b.Stats()
	for outcome, n := range map[string]uint64{"answered": st.Results.Answered, "refused": st.Results.Refused, "abandoned": st.Results.Abandoned} {
		ch <- prometheus.MustNewConstMetric(bridgeResults, prometheus.CounterValue, float64(n), outcome)
	}
	for port, p := range st.Ports {
		ch <- prometheus.MustNewConstMetric(bridgeConns, prometheus.GaugeValue, float64(p.Open), port)
		ch <- prometheus.MustNewConstMetric(bridgeAccepted, prometheus.CounterValue, float64(p.Accepted), port)
		ch <- prometheus.MustNewConstMetric(bridgeRefused, prometheus.CounterValue, float64(p.Refused), port)
		for reason, n := range p.FrameErrors {
			ch <- prometheus.MustNewConstMetric(bridgeFrameErrors, prometheus.CounterValue, float64(n), port, reason)
		}
	}
}
