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
