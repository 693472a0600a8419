package cli_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// pki is a throwaway certificate authority with a server and a client certificate,
// written as PEM files.
type pki struct {
	dir                       string
	ca, serverCert, serverKey string
	clientCert, clientKey     string
	caPool                    *x509.CertPool
	serverPair                tls.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "jobbus test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(caCert)
	p.ca = p.write(t, "ca.pem", "CERTIFICATE", caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (certFile, keyFile string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(key)
		return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+"-key.pem", "EC PRIVATE KEY", kb)
	}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	pair, err := tls.LoadX509KeyPair(p.serverCert, p.serverKey)
	if err != nil {
		t.Fatal(err)
	}
	p.serverPair = pair
	return p
}

func (p *pki) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTLSAndNKeyFlags: against a NATS server that requires TLS with client
// certificates and an nkey user, the CLI gets in with --tls-ca, --tls-cert, --tls-key
// and --nkey, and is refused without them.
func TestTLSAndNKeyFlags(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	seedFile := filepath.Join(p.dir, "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(),
		Nkeys: []*server.NkeyUser{{Nkey: pub}},
		TLS:   true, TLSVerify: true, TLSTimeout: 5,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{p.serverPair}, ClientCAs: p.caPool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	url := ns.ClientURL()

	nkeyOpt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	coordNC, err := nats.Connect(url, nkeyOpt, nats.RootCAs(p.ca), nats.ClientCert(p.clientCert, p.clientKey))
	if err != nil {
		t.Fatalf("coordinator connect: %v", err)
	}
	t.Cleanup(coordNC.Close)
	jobbustest.Go(t, func(ctx context.Context) error {
		return coordinator.Run(ctx, coordNC, jobbustest.FastCoordinatorConfig(), nil)
	})

	full := []string{"--nats", url, "--nkey", seedFile, "--tls-ca", p.ca, "--tls-cert", p.clientCert, "--tls-key", p.clientKey}
	eventually(t, "workers answered over TLS with an nkey", func() bool {
		code, out, _ := cliRun(full, "workers")
		return code == cli.ExitOK && strings.HasPrefix(out, "WORKER")
	})
	for name, flags := range map[string][]string{
		"NoNKey":       {"--nats", url, "--tls-ca", p.ca, "--tls-cert", p.clientCert, "--tls-key", p.clientKey},
		"NoClientCert": {"--nats", url, "--nkey", seedFile, "--tls-ca", p.ca},
		"NoCA":         {"--nats", url, "--nkey", seedFile, "--tls-cert", p.clientCert, "--tls-key", p.clientKey},
	} {
		if code, _, errs := cliRun(flags, "workers"); code != cli.ExitError || !strings.Contains(errs, "cannot reach NATS") {
			t.Errorf("%s: exit %d, stderr %q; want a refused connection", name, code, errs)
		}
	}
}
