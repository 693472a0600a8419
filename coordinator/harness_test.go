package coordinator_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest/suite"
	"github.com/jobbus/jobbus/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher(), goleak.Cleanup(func(int) { removeBinary() }))
}

// The coordinator's own tests drive the lifecycle suite's system (internal/jobbustest/suite)
// over the native transport.
type system = suite.System

// setup starts a native system whose coordinator configuration mods change.
func setup(t testing.TB, mods ...func(*coordinator.Config)) *system {
	t.Helper()
	return suite.Setup(t, suite.Native, mods...)
}

var coordinatorAddr = bus.Address{Role: bus.RoleCoordinator}

// The suite's helpers, under the names these tests use.
var (
	must    = suite.Must
	text    = suite.Text
	rawJSON = suite.RawJSON
	deref   = suite.Deref
)
