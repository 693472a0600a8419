package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/coordinator"
)

// newWorkflows is the counter of workflows and batches by kind and event: started
// (stored whole), completed, failed (a step failed) or cancelled, each counted when
// its last step ended.
func newWorkflows() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "workflows_total",
		Help: "Workflows and batches by kind (workflow, batch) and event: started (stored whole), completed, failed (a step failed), cancelled; an end is counted when the last step ended."},
		[]string{"kind", "event"})
}

var _ coordinator.WorkflowObserver = (*Coordinator)(nil)

// WorkflowChanged counts a workflow or batch that started or ended
// (coordinator.WorkflowObserver).
func (m *Coordinator) WorkflowChanged(kind string, state protocol.State) {
	m.workflows.WithLabelValues(kind, strings.ToLower(string(state))).Inc()
}
