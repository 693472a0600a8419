package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/internal/version"
)

// TestVersionOnePlace: `jobbus version`, `jobbus --version` and the micro service's
// INFO all report the one version of package version.
func TestVersionOnePlace(t *testing.T) {
	t.Parallel()
	want := "jobbus version " + version.String() + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}, {"-v"}} {
		code, out, errs := cliRun(nil, args...)
		if code != cli.ExitOK || out != want {
			t.Errorf("jobbus %s: exit %d, printed %q (stderr %q), want %q", strings.Join(args, " "), code, out, errs, want)
		}
	}
	s := setup(t, noWorker())
	msg, err := s.NC.Request("$SRV.INFO.jobbus", nil, 10*time.Second)
	if err != nil {
		t.Fatalf("micro INFO: %v", err)
	}
	var info struct{ Version string }
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatalf("micro INFO %s: %v", msg.Data, err)
	}
	if info.Version != version.String() {
		t.Errorf("micro service version %q, want %q", info.Version, version.String())
	}
}
