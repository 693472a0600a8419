package coordinator_test

import (
	"testing"

	"github.com/jobbus/jobbus/internal/jobbustest/suite"
)

// TestJobLifecycle runs the lifecycle suite over the native transport and the two mixes
// of native and TCP peers; the bridge's suite runs it over TCP alone.
func TestJobLifecycle(t *testing.T) {
	for _, tr := range []suite.Transport{suite.Native, suite.TCPClientNativeWorkers, suite.NativeClientTCPWorkers} {
		t.Run(tr.Name, func(t *testing.T) {
			t.Parallel()
			suite.RunLifecycle(t, tr)
		})
	}
}

// TestFunctions runs the functions suite (task types of the workers' own) over the
// native transport and the two mixes; the bridge's suite runs it over TCP alone.
func TestFunctions(t *testing.T) {
	for _, tr := range []suite.Transport{suite.Native, suite.TCPClientNativeWorkers, suite.NativeClientTCPWorkers} {
		t.Run(tr.Name, func(t *testing.T) {
			t.Parallel()
			suite.RunFunctions(t, tr)
		})
	}
}

// TestWorkflows runs the workflow suite (dependencies, workflows, batches) over the
// native transport and the two mixes; the bridge's suite runs it over TCP alone.
func TestWorkflows(t *testing.T) {
	for _, tr := range []suite.Transport{suite.Native, suite.TCPClientNativeWorkers, suite.NativeClientTCPWorkers} {
		t.Run(tr.Name, func(t *testing.T) {
			t.Parallel()
			suite.RunWorkflows(t, tr)
		})
	}
}
