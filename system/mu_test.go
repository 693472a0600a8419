package system_test

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/bus/protocol/mu"
	"github.com/jobbus/jobbus/internal/munode"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/system"
)

// TestMuPort: a system whose bridge serves only the Mu port (as serve --worker-port -1
// --client-port -1 --mu-port N) runs a job a Mu node submits, counts the Mu port in
// /metrics, and frees the port on Close.
func TestMuPort(t *testing.T) {
	t.Parallel()
	bcfg := bridge.DefaultConfig()
	bcfg.WorkerListen, bcfg.ClientListen, bcfg.MuListen = "", "", "127.0.0.1:0"
	sys := start(t, system.Config{
		NATS: embedded(t.TempDir()), Coordinator: fastCoordinator(), Bridge: &bcfg,
		HTTPListen: "127.0.0.1:0", Metrics: true, Workers: quietWorkers(1),
	})
	leading(t, sys)
	addr := sys.Bridge().MuAddr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := munode.Dial(ctx, addr, mu.Address{Host: "10.1.2.3", Port: 27777}, munode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	reply, err := n.Ask(ctx, "jobbus.api.submit", json.RawMessage(`{"type":"SUBMIT_JOB","taskType":"SHA256","payload":{"text":"mu"}}`))
	var sub protocol.JobSubmitted
	if err != nil || json.Unmarshal(reply, &sub) != nil || sub.JobID == "" {
		t.Fatalf("submit: %s, %v", reply, err)
	}
	testkit.Eventually(t, 20*time.Second, "the job completes", func() bool {
		reply, err := n.Ask(ctx, "jobbus.api.status", json.RawMessage(`{"type":"GET_JOB_STATUS","jobId":"`+sub.JobID+`"}`))
		return err == nil && strings.Contains(string(reply), `"state":"COMPLETED"`)
	})
	if _, body := get(t, sys.HTTPAddr(), "/metrics"); !strings.Contains(body, `jobbus_bridge_connections{port="mu"} 1`) {
		t.Errorf("/metrics does not count the Mu connection:\n%s", body)
	}
	if err := sys.Close(); err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Errorf("%s still listening after Close", addr)
	}
}
