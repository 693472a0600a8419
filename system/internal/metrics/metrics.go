// Package metrics exports what jobbus does as Prometheus metrics (named by the
// client_golang conventions: jobbus_..., _total, _seconds): a coordinator's job
// lifecycle through its Observer hook, and the counters that the bus, the bridge and
// the coordinator already keep, read at scrape time through collectors, so nothing is
// counted twice.
//
// Everything lives in one Registry per process; nothing is global.
package metrics

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus"
)

const namespace = "jobbus"

// Registry holds a process's metrics: Go runtime and process metrics, plus whatever
// its parts add (Coordinator, AddBridge, AddBus).
type Registry struct {
	reg *prometheus.Registry

	busOnce sync.Once
	bus     *busCollector
	coord   *Coordinator
}

// New returns a registry with the Go runtime and process collectors.
func New() *Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Registry{reg: reg}
}

// Prometheus returns the underlying registry, to gather from or add to.
func (r *Registry) Prometheus() *prometheus.Registry { return r.reg }

// Handler serves the metrics in the Prometheus exposition formats.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg, EnableOpenMetrics: true})
}

// AddBus reports the counters of bus nodes under role: stats is called at each scrape
// and must return counts that only grow (sum ended nodes in, see bus.Stats.Add).
func (r *Registry) AddBus(role string, stats func() bus.Stats) {
	r.busOnce.Do(func() {
		r.bus = &busCollector{}
		r.reg.MustRegister(r.bus)
	})
	r.bus.add(role, stats)
}

// AddBridge reports a bridge's connections and frame errors per port, and the bus
// nodes of its TCP workers (role "bridge").
func (r *Registry) AddBridge(b *bridge.Bridge) {
	r.reg.MustRegister(&bridgeCollector{b: b})
	r.AddBus("bridge", func() bus.Stats { return b.Stats().Bus })
}
