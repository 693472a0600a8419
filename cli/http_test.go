package cli_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/cli"
)

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestServeHTTPListener runs serve with its HTTP listener: ready once the coordinator
// leads, metrics that count a job run through the CLI, and the dashboard.
func TestServeHTTPListener(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var base string
	var natsFlags []string
	_, _ = startOnFreePorts(t, 4, func(p []int) *running {
		base = "http://" + hostPort(p[3])
		natsFlags = []string{"--nats", "nats://" + hostPort(p[0])}
		return start(t, nil, "serve", "--data-dir", dir, "--nats-listen", hostPort(p[0]),
			"--worker-port", strconv.Itoa(p[1]), "--client-port", strconv.Itoa(p[2]), "--http-listen", hostPort(p[3]),
			"--workers", "1", "--heartbeat-timeout-millis", "600")
	}, func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == http.StatusOK
	})
	if code, body := httpGet(t, base+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	code, out, errs := cliRun(natsFlags, "submit", "sha256", "--text", "metered", "--wait")
	if code != cli.ExitOK {
		t.Fatalf("submit: exit %d: %s", code, errs)
	}
	eventually(t, "the job counted", func() bool {
		_, m := httpGet(t, base+"/metrics")
		return strings.Contains(m, `jobbus_jobs{state="COMPLETED"} 1`+"\n") &&
			strings.Contains(m, `jobbus_jobs_completed_total{task_type="SHA256"} 1`+"\n") &&
			strings.Contains(m, `jobbus_submissions_total{outcome="accepted"} 1`+"\n")
	})
	_, m := httpGet(t, base+"/metrics")
	for _, want := range []string{"jobbus_coordinator_leading 1\n", "jobbus_workers 1\n", "jobbus_leader_changes_total 1\n",
		`jobbus_bridge_connections{port="client"} 0` + "\n", `jobbus_bus_asks_total{outcome="ok",role="worker"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if code, page := httpGet(t, base+"/"); code != http.StatusOK || !strings.Contains(page, `name="jobbus-token"`) {
		t.Errorf("/: %d, %d bytes", code, len(page))
	}
	id := strings.Fields(out)[1] // the job shown by --wait: "ID <id>"
	eventually(t, "the dashboard to list the job", func() bool {
		_, jobs := httpGet(t, base+"/api/jobs")
		return strings.Contains(jobs, fmt.Sprintf(`"jobId":%q`, id))
	})
}

// TestDashboardCommand serves the dashboard of a system it reaches over NATS only.
func TestDashboardCommand(t *testing.T) {
	t.Parallel()
	s := setup(t)
	var base string
	startOnFreePorts(t, 1, func(p []int) *running {
		base = "http://" + hostPort(p[0])
		return start(t, []string{"--nats", s.url}, "dashboard", "--http-listen", hostPort(p[0]))
	}, func() bool {
		code, _ := httpGet(t, base+"/healthz")
		return code == http.StatusOK
	})
	// The test system's coordinator runs without the leader lease: not ready, and why
	// (once connected: /healthz answers while the dashboard still connects to NATS).
	eventually(t, "/readyz to say no coordinator leads", func() bool {
		code, body := httpGet(t, base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "no coordinator leads")
	})
	code, out, errs := cliRun([]string{"--nats", s.url}, "submit", "word_count", "--text", "a b c")
	if code != cli.ExitOK {
		t.Fatalf("submit: exit %d: %s", code, errs)
	}
	id := strings.TrimSpace(out)
	eventually(t, "the dashboard to show the job", func() bool {
		_, body := httpGet(t, base+"/api/jobs/"+id)
		return strings.Contains(body, `"taskType":"WORD_COUNT"`)
	})

	if code, _, errs := cliRun([]string{"--nats", s.url}, "dashboard", "--http-listen", "-"); code != cli.ExitUsage || !strings.Contains(errs, "nothing to serve") {
		t.Errorf("dashboard with the listener off: exit %d, stderr %q", code, errs)
	}
}
