package bridge_test

import (
	"testing"

	"github.com/jobbus/jobbus/internal/jobbustest/suite"
)

// TestJobLifecycle runs the lifecycle suite with clients and workers on the bridge's
// spec TCP ports alone; the coordinator's suite runs the native transport and mixes.
func TestJobLifecycle(t *testing.T) {
	t.Parallel()
	suite.RunLifecycle(t, suite.TCP)
}

// TestFunctions runs the functions suite with clients and test-driven workers on the
// bridge's TCP ports (the workers declare their types with taskTypes).
func TestFunctions(t *testing.T) {
	t.Parallel()
	suite.RunFunctions(t, suite.TCP)
}

// TestWorkflows runs the workflow suite with clients and workers on the bridge's TCP
// ports.
func TestWorkflows(t *testing.T) {
	t.Parallel()
	suite.RunWorkflows(t, suite.TCP)
}
