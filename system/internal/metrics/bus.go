package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobbus/jobbus/bus"
)

// Descriptions of the bus metrics; every one has the label role (coordinator, worker,
// bridge): the kind of node the counts come from.
var (
	busSent = prometheus.NewDesc(namespace+"_bus_messages_sent_total",
		"Bus messages published, by kind (tell, ask, response, error, heartbeat).", []string{"role", "kind"}, nil)
	busReceived = prometheus.NewDesc(namespace+"_bus_messages_received_total",
		"Bus messages received, by kind.", []string{"role", "kind"}, nil)
	busBytesSent = prometheus.NewDesc(namespace+"_bus_sent_bytes_total",
		"Payload bytes published on the bus.", []string{"role"}, nil)
	busBytesReceived = prometheus.NewDesc(namespace+"_bus_received_bytes_total",
		"Payload bytes received from the bus.", []string{"role"}, nil)
	busAsks = prometheus.NewDesc(namespace+"_bus_asks_total",
		"Asks by outcome (ok, remote_error, timeout, no_peer, disconnected, failed).", []string{"role", "outcome"}, nil)
	busAskDuration = prometheus.NewDesc(namespace+"_bus_ask_duration_seconds",
		"Round-trip time of answered asks.", []string{"role"}, nil)
	busReconnects = prometheus.NewDesc(namespace+"_bus_reconnects_total",
		"Times the NATS connection came back after being lost.", []string{"role"}, nil)
	busDisconnects = prometheus.NewDesc(namespace+"_bus_disconnects_total",
		"Times the NATS connection was lost.", []string{"role"}, nil)
	busHandlerErrors = prometheus.NewDesc(namespace+"_bus_handler_errors_total",
		"Bus handlers that returned an error.", []string{"role"}, nil)
	busHandlerPanics = prometheus.NewDesc(namespace+"_bus_handler_panics_total",
		"Bus handlers that panicked.", []string{"role"}, nil)
	busDropped = prometheus.NewDesc(namespace+"_bus_dropped_total",
		"Bus messages not handled: malformed, unexpected or arriving while closing.", []string{"role"}, nil)
	busInFlight = prometheus.NewDesc(namespace+"_bus_handlers_in_flight",
		"Bus handlers running now.", []string{"role"}, nil)
)

// busCollector reads bus.Stats at scrape time.
type busCollector struct {
	mu      sync.Mutex
	sources []busSource
}

type busSource struct {
	role  string
	stats func() bus.Stats
}

func (c *busCollector) add(role string, stats func() bus.Stats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources = append(c.sources, busSource{role, stats})
}

func (c *busCollector) Describe(ch chan<- *prometheus.Desc) { describeBus(ch) }

func (c *busCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := c.sources
	c.mu.Unlock()
	// One series per role: sources of the same role add up.
	byRole := map[string]*bus.Stats{}
	var roles []string
	for _, s := range sources {
		if byRole[s.role] == nil {
			byRole[s.role] = &bus.Stats{}
			roles = append(roles, s.role)
		}
		byRole[s.role].Add(s.stats())
	}
	for _, role := range roles {
		collectBus(ch, role, *byRole[role])
	}
}

func describeBus(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{busSent, busReceived, busBytesSent, busBytesReceived, busAsks,
		busAskDuration, busReconnects, busDisconnects, busHandlerErrors, busHandlerPanics, busDropped, busInFlight} {
		ch <- d
	}
}

func collectBus(ch chan<- prometheus.Metric, role string, s bus.Stats) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{role}, labels...)...)
	}
	for _, k := range []struct {
		name     string
		sent, rx uint64
	}{
		{"tell", s.Sent.Tell, s.Received.Tell}, {"ask", s.Sent.Ask, s.Received.Ask},
		{"response", s.Sent.Response, s.Received.Response}, {"error", s.Sent.Error, s.Received.Error},
		{"heartbeat", s.Sent.Heartbeat, s.Received.Heartbeat},
	} {
		counter(busSent, k.sent, k.name)
		counter(busReceived, k.rx, k.name)
	}
	counter(busBytesSent, s.BytesSent)
	counter(busBytesReceived, s.BytesReceived)
	for _, o := range []struct {
		name string
		n    uint64
	}{
		{"ok", s.Asks.OK}, {"remote_error", s.Asks.RemoteError}, {"timeout", s.Asks.Timeout},
		{"no_peer", s.Asks.NoPeer}, {"disconnected", s.Asks.Disconnected}, {"failed", s.Asks.Failed},
	} {
		counter(busAsks, o.n, o.name)
	}
	// bus.Stats buckets hold the asks above the previous bound; Prometheus's are cumulative.
	buckets := make(map[float64]uint64, len(s.AskLatency))
	var total uint64
	for _, b := range s.AskLatency {
		total += b.Count
		if b.UpTo > 0 {
			buckets[b.UpTo.Seconds()] = total
		}
	}
	ch <- prometheus.MustNewConstHistogram(busAskDuration, total, s.AskLatencySum.Seconds(), buckets, role)
	counter(busReconnects, s.Reconnects)
	counter(busDisconnects, s.Disconnects)
	counter(busHandlerErrors, s.HandlerErrors)
	counter(busHandlerPanics, s.HandlerPanics)
	counter(busDropped, s.Dropped)
	ch <- prometheus.MustNewConstMetric(busInFlight, prometheus.GaugeValue, float64(s.InFlight), role)
}
