package cli_test

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
)

// pki is the test CA of internal/testkit.
type pki = testkit.PKI

func newPKI(t *testing.T) *pki { return testkit.NewPKI(t) }

// TestTLSAndNKeyFlags: against a NATS server that requires TLS with client
// certificates and an nkey user, the CLI gets in with --tls-ca, --tls-cert, --tls-key
// and --nkey, and is refused without them.
func TestTLSAndNKeyFlags(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	seedFile := filepath.Join(p.Dir, "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	ns := runNATS(t, &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: t.TempDir(),
		Nkeys: []*server.NkeyUser{{Nkey: pub}},
		TLS:   true, TLSVerify: true, TLSTimeout: 5,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{p.ServerPair}, ClientCAs: p.CAPool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
		},
	})
	url := ns.ClientURL()

	nkeyOpt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	coordNC, err := nats.Connect(url, nkeyOpt, nats.RootCAs(p.CA), nats.ClientCert(p.ClientCert, p.ClientKey))
	if err != nil {
		t.Fatalf("coordinator connect: %v", err)
	}
	t.Cleanup(coordNC.Close)
	jobbustest.Go(t, func(ctx context.Context) error {
		return coordinator.Run(ctx, coordNC, jobbustest.FastCoordinatorConfig(), nil)
	})

	full := []string{"--nats", url, "--nkey", seedFile, "--tls-ca", p.CA, "--tls-cert", p.ClientCert, "--tls-key", p.ClientKey}
	eventually(t, "workers answered over TLS with an nkey", func() bool {
		code, out, _ := cliRun(full, "workers")
		return code == cli.ExitOK && strings.HasPrefix(out, "WORKER")
	})
	for name, flags := range map[string][]string{
		"NoNKey":       {"--nats", url, "--tls-ca", p.CA, "--tls-cert", p.ClientCert, "--tls-key", p.ClientKey},
		"NoClientCert": {"--nats", url, "--nkey", seedFile, "--tls-ca", p.CA},
		"NoCA":         {"--nats", url, "--nkey", seedFile, "--tls-cert", p.ClientCert, "--tls-key", p.ClientKey},
	} {
		if code, _, errs := cliRun(flags, "workers"); code != cli.ExitError || !strings.Contains(errs, "cannot reach NATS") {
			t.Errorf("%s: exit %d, stderr %q; want a refused connection", name, code, errs)
		}
	}
}

// TestBadNATSTLSFilesRefused: a missing or bad --tls-ca, --tls-cert/--tls-key,
// --nats-creds, or a context's ca, is a usage error naming the flag (or context) and the file, at once,
// for every command that talks to NATS; the services (coordinator, bridge, dashboard,
// serve --nats) waited for NATS for ever instead, saying "is a nats-server running
// there?".
func TestBadNATSTLSFilesRefused(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	ctxFile := filepath.Join(dir, "badca.json")
	if err := os.WriteFile(ctxFile, []byte(`{"url":"nats://127.0.0.1:1","ca":"`+bad+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	const url = "nats://127.0.0.1:1" // nothing listens: only the files can be wrong
	files := map[string]struct {
		flags []string
		want  []string // in stderr
	}{
		"MissingCA":    {[]string{"--nats", url, "--tls-ca", missing}, []string{"--tls-ca", missing}},
		"BadCA":        {[]string{"--nats", url, "--tls-ca", bad}, []string{"--tls-ca", bad}},
		"BadCert":      {[]string{"--nats", url, "--tls-ca", p.CA, "--tls-cert", bad, "--tls-key", p.ClientKey}, []string{"--tls-cert", bad}},
		"ContextCA":    {[]string{"--context", ctxFile}, []string{"--context", bad}},
		"MissingCreds": {[]string{"--nats", url, "--nats-creds", missing}, []string{"--nats-creds", missing}},
		"BadCreds":     {[]string{"--nats", url, "--nats-creds", bad}, []string{"--nats-creds", bad}},
	}
	commands := map[string][]string{
		"jobs":        {"jobs"},
		"worker":      {"worker"},
		"coordinator": {"coordinator"},
		"bridge":      {"bridge", "--worker-port", "0", "--client-port", "-1"},
		"dashboard":   {"dashboard", "--http-listen", "127.0.0.1:0"},
		"serve":       {"serve", "--worker-port", "-1", "--client-port", "-1", "--http-listen", "-"},
	}
	for fname, f := range files {
		for cname, args := range commands {
			t.Run(fname+"/"+cname, func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				cmd := exec.CommandContext(ctx, jobbusBin, append(slices.Clone(f.flags), args...)...)
				var stderr strings.Builder
				cmd.Stderr = &stderr
				err := cmd.Run()
				var exit *exec.ExitError
				if ctx.Err() != nil || !errors.As(err, &exit) || exit.ExitCode() != cli.ExitUsage {
					t.Fatalf("exit %v (deadline: %v), want %d; stderr:\n%s", err, ctx.Err(), cli.ExitUsage, stderr.String())
				}
				for _, want := range f.want {
					if !strings.Contains(stderr.String(), want) {
						t.Errorf("stderr does not name %q:\n%s", want, stderr.String())
					}
				}
			})
		}
	}
}

// TestBadBridgeTLSFilesRefused: a missing or bad --bridge-tls-cert, --bridge-tls-key
// or --bridge-tls-client-ca is a usage error naming the flag and the file.
func TestBadBridgeTLSFilesRefused(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	bad := filepath.Join(t.TempDir(), "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ flags, want []string }{
		"BadCert":     {[]string{"--bridge-tls-cert", bad, "--bridge-tls-key", p.ServerKey}, []string{"--bridge-tls-cert", bad}},
		"BadKey":      {[]string{"--bridge-tls-cert", p.ServerCert, "--bridge-tls-key", bad}, []string{"--bridge-tls-key", bad}},
		"MismatchKey": {[]string{"--bridge-tls-cert", p.ServerCert, "--bridge-tls-key", p.ClientKey}, []string{"--bridge-tls-key", p.ClientKey}},
		"BadClientCA": {[]string{"--bridge-tls-cert", p.ServerCert, "--bridge-tls-key", p.ServerKey, "--bridge-tls-client-ca", bad}, []string{"--bridge-tls-client-ca", bad}},
	} {
		t.Run(name, func(t *testing.T) {
			code, _, errs := cliRun([]string{"--nats", "nats://127.0.0.1:1"}, append([]string{"bridge", "--worker-port", "0", "--client-port", "-1"}, tc.flags...)...)
			if code != cli.ExitUsage {
				t.Fatalf("exit %d, want %d: %s", code, cli.ExitUsage, errs)
			}
			for _, want := range tc.want {
				if !strings.Contains(errs, want) {
					t.Errorf("stderr does not name %q: %s", want, errs)
				}
			}
		})
	}
}
