package worker

import "github.com/jobbus/jobbus/bus"

// BusStats returns the counters of the worker's bus node, for metrics.
func (w *Worker) BusStats() bus.Stats { return w.node.Stats() }
