package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/jobbus/jobbus/bus/protocol"
)

// TestMuNodeCommand: serve with --mu-port, a `jobbus mu-node` process echoing, and
// `jobbus mu-node --ask` asking it through the bridge, submitting a job and reading its
// status over Mu frames.
func TestMuNodeCommand(t *testing.T) {
	t.Parallel()
	p, _ := serveProc(t, t.TempDir(), "--mu-port", "0", "--workers", "1")
	addr := p.logged(`msg="bridge listening" port=mu addr=(\S+)`)[1]
	echo := startProc(t, nil, "mu-node", "--connect", addr, "--address", "10.9.8.7:27777", "--echo", "echo", "--echo", "again")
	echo.logged(`msg="mu node registered"`)

	ask := func(path, payload string) (int, string, string) {
		return cliRun(nil, "mu-node", "--connect", addr, "--address", "asker:1", "--ask", path, "--payload", payload)
	}
	if code, out, errs := ask("again@10.9.8.7:27777", `{"hi":[1,2]}`); code != 0 || strings.TrimSpace(out) != `{"hi":[1,2]}` {
		t.Fatalf("ask the echoing node: exit %d, %q, %q", code, out, errs)
	}
	code, out, errs := ask("jobbus.api.submit", `{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"mu"}}`)
	var sub protocol.JobSubmitted
	if err := json.Unmarshal([]byte(out), &sub); code != 0 || err != nil || sub.JobID == "" {
		t.Fatalf("submit over Mu: exit %d, %q, %q", code, out, errs)
	}
	eventually(t, "the job completes", func() bool {
		_, out, _ := ask("jobbus.api.status", `{"type":"GET_JOB_STATUS","jobId":"`+sub.JobID+`"}`)
		return strings.Contains(out, `"state":"COMPLETED"`)
	})
	if code, _, errs := ask("echo@10.9.8.7:1", `1`); code != 1 || !strings.Contains(errs, "no peer") {
		t.Fatalf("ask an address nobody registered: exit %d, %q", code, errs)
	}
}
