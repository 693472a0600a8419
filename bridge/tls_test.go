package bridge_test

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/internal/testkit/specpeer"
)

// TestTLS: with TLS and a client CA, both ports speak PROTOCOL.md's frames inside the
// TLS stream (a worker registers, runs a job a client submitted and reports it); a
// plain TCP peer, a peer without a client certificate and one that never finishes
// its handshake are closed without costing anyone else.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := testkit.NewPKI(t)
	s := setup(t, withBridge(func(c *bridgeConfig) {
		c.FrameStallTimeout = 500 * time.Millisecond
		c.TLS = &tls.Config{
			Certificates: []tls.Certificate{pki.ServerPair},
			ClientCAs:    pki.CAPool, ClientAuth: tls.RequireAndVerifyClientCert,
			MinVersion: tls.VersionTLS12,
		}
	}))
	dialTLS := func(addr net.Addr, cert bool) (*tls.Conn, error) {
		cfg := &tls.Config{RootCAs: pki.CAPool, ServerName: "127.0.0.1"}
		if cert {
			cfg.Certificates = []tls.Certificate{pki.ClientPair}
		}
		d := &net.Dialer{Timeout: waitFor}
		c, err := tls.DialWithDialer(d, "tcp", addr.String(), cfg)
		if err == nil {
			t.Cleanup(func() { _ = c.Close() })
		}
		return c, err
	}

	wc, err := dialTLS(s.br.WorkerAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	w := specpeer.Use(t, wc, specpeer.WithTimeout(waitFor))
	w.Register("tls-worker", 1)
	cc, err := dialTLS(s.br.ClientAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	client := specpeer.Use(t, cc, specpeer.WithTimeout(waitFor))
	id := client.Submit("SHA256", `{"text":"over TLS"}`)
	a := w.ExpectAssign(id)
	w.MustSend(&protocol.TaskResult{WorkerID: "tls-worker", JobID: id, AttemptID: a.AttemptID, Success: true, Result: ptr("r")})
	s.waitState(id, protocol.StateCompleted)
	if st, ok := client.Request(&protocol.GetJobStatus{JobID: id}).(*protocol.JobStatus); !ok || st.Job.State != protocol.StateCompleted {
		t.Fatalf("status over TLS: %+v", st)
	}

	for _, addr := range []net.Addr{s.br.ClientAddr(), s.br.WorkerAddr()} {
		plain := dial(t, addr) // speaks frames without TLS: not a ClientHello
		_ = plain.Send(&protocol.ListWorkers{})
		plain.ExpectClosed()

		silent := dial(t, addr) // never starts its handshake: closed after the stall timeout
		silent.ExpectClosed()

		// Without a client certificate the handshake fails, on the client's side at
		// once or at its first read (TLS 1.3 reports the server's refusal late).
		if c, err := dialTLS(addr, false); err == nil {
			p := specpeer.Use(t, c, specpeer.WithTimeout(waitFor))
			_ = p.Send(&protocol.ListWorkers{})
			p.ExpectClosed()
		}
	}
	if _, ok := client.Request(&protocol.ListWorkers{}).(*protocol.WorkerList); !ok {
		t.Fatal("the TLS client was not served after the refused peers")
	}
}
