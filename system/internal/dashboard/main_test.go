package dashboard_test

import (
	"testing"

	"github.com/jobbus/jobbus/internal/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher()) }
