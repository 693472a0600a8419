package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestServeAuthentication: serve's embedded NATS requires what its flags say (a user
// and password, a token, or a nats-server configuration file with a user per role):
// an anonymous connection gets nothing (also when the client port requires TLS), the right credentials get in, and serve's own
// coordinator and workers run with them.
func TestServeAuthentication(t *testing.T) {
	t.Parallel()
	pki := testkit.NewPKI(t) // for the client port's TLS, trusted with --tls-ca
	conf := func(port int, dir string) string {
		data, err := os.ReadFile("../docs/nats-server.conf")
		if err != nil {
			t.Fatal(err)
		}
		s := regexp.MustCompile(`(?m)^port: .*$`).ReplaceAllString(string(data), "port: "+strconv.Itoa(port))
		s = regexp.MustCompile(`(?m)^  store_dir: .*$`).ReplaceAllString(s, "  store_dir: "+strconv.Quote(filepath.Join(dir, "js")))
		path := filepath.Join(dir, "nats-server.conf")
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, tc := range []struct {
		name string
		// flags builds serve's authentication flags; user is the URL's user part for
		// a client that may submit, reader for one that may only read ("" if none).
		flags        func(port int, dir string) []string
		user, reader string
	}{
		{"UserPassword", func(int, string) []string { return []string{"--nats-user", "ops", "--nats-password", "s3cret"} }, "ops:s3cret", ""},
		{"Token", func(int, string) []string { return []string{"--nats-token", "t0ken"} }, "t0ken", ""},
		{"ConfigFile", func(port int, dir string) []string {
			return []string{"--nats-config", conf(port, dir), "--nats-user", "coordinator", "--nats-password", "change-me-coordinator"}
		}, "submitter:change-me-submitter", "reader:change-me-reader"},
		{"ConfigFileTLS", func(port int, dir string) []string {
			path := filepath.Join(dir, "tls.conf")
			text := fmt.Sprintf("port: %d\ntls { cert_file: %q, key_file: %q }\nauthorization { user: ops, password: s3cret }\n", port, pki.ServerCert, pki.ServerKey)
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{"--nats-config", path, "--nats-user", "ops", "--nats-password", "s3cret"}
		}, "ops:s3cret", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			var url func(user string) []string
			r, _ := startOnFreePorts(t, 1, func(p []int) *running {
				url = func(user string) []string {
					if user != "" {
						user += "@"
					}
					flags := []string{"--nats", fmt.Sprintf("nats://%s%s", user, hostPort(p[0]))}
					if strings.HasSuffix(tc.name, "TLS") {
						flags = append(flags, "--tls-ca", pki.CA)
					}
					return flags
				}
				return start(t, nil, "serve", append([]string{"--data-dir", dir, "--nats-listen", hostPort(p[0]),
					"--worker-port", "-1", "--client-port", "-1", "--workers", "1", "--http-listen", "-"}, tc.flags(p[0], dir)...)...)
			}, func() bool {
				code, out, _ := cliRun(url(tc.user), "workers", "--json")
				return code == cli.ExitOK && strings.Count(out, `"workerId"`) == 1
			})
			if code, out, errs := cliRun(url(tc.user), "submit", "--wait", "--json", "sha256", "--text", "authenticated"); code != cli.ExitOK || !strings.Contains(out, `"COMPLETED"`) {
				t.Fatalf("submit with credentials: exit %d\n%s%s", code, out, errs)
			}
			code, _, errs := cliRun(url(""), "jobs")
			if code != cli.ExitError || !strings.Contains(strings.ToLower(errs), "authorization violation") {
				t.Errorf("an anonymous connection: exit %d, stderr %q; want exit 1 and NATS's authorization violation", code, errs)
			}
			if tc.reader != "" {
				if code, _, errs := cliRun(url(tc.reader), "jobs"); code != cli.ExitOK {
					t.Errorf("the reader's jobs: exit %d %s", code, errs)
				}
				if code, _, errs := cliRun(url(tc.reader), "submit", "sha256", "--text", "no"); code != cli.ExitError || !strings.Contains(errs, "Permissions Violation") {
					t.Errorf("the reader's submit: exit %d %q, want a permissions violation", code, errs)
				}
			}
			if strings.Contains(r.errs.String(), "without authentication") {
				t.Errorf("serve warned of no authentication:\n%s", r.errs)
			}
		})
	}
}

// TestOpenListenWarnings: serve warns, naming the flags to add, when NATS, the TCP
// ports or the HTTP listener (dashboard, whose buttons cancel jobs) listen beyond
// loopback without authentication.
func TestOpenListenWarnings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var cur *running
	startOnFreePorts(t, 4, func(p []int) *running {
		cur = start(t, nil, "serve", "--data-dir", dir, "--nats-listen", fmt.Sprintf("0.0.0.0:%d", p[0]),
			"--listen-host", "0.0.0.0", "--worker-port", strconv.Itoa(p[1]), "--client-port", strconv.Itoa(p[2]),
			"--http-listen", fmt.Sprintf(":%d", p[3]))
		return cur
	}, func() bool {
		return strings.Contains(cur.errs.String(), "jobbus serving") || strings.Contains(cur.out.String(), "jobbus serving")
	})
	logs := cur.errs.String() + cur.out.String()
	for _, want := range []string{
		"the embedded NATS server listens beyond loopback without authentication", "--nats-user", "--nats-config",
		"the TCP ports listen beyond loopback without authentication", "--bridge-tls-client-ca",
		"the HTTP listener listens beyond loopback without authentication",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("serve's log does not say %q:\n%s", want, logs)
		}
	}
}

// TestTokenNeverShown: a token given in the NATS URL (nats://TOKEN@host, as
// docs/security.md shows for --nats-token) is never printed: not in the logs of the
// services that connect with it, nor in `jobbus cluster`. url.URL.Redacted, which
// nats.go's ConnectedUrlRedacted uses, hides only a password.
func TestTokenNeverShown(t *testing.T) {
	t.Parallel()
	const token = "t0kenSecret"
	ns := runNATS(t, &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: t.TempDir(), Authorization: token})
	url := strings.Replace(ns.ClientURL(), "nats://", "nats://"+token+"@", 1)
	global := []string{"--nats", url}
	coord := start(t, global, "coordinator")
	worker := start(t, global, "worker", "--id", "w-token")
	var out string
	eventually(t, "the coordinator and the worker up", func() bool {
		code, o, _ := cliRun(global, "cluster")
		_, w, _ := cliRun(global, "workers")
		out = o
		return code == cli.ExitOK && strings.Contains(o, "leading") && strings.Contains(w, "w-token") &&
			strings.Contains(coord.errs.String()+coord.out.String(), "coordinator campaigning")
	})
	for what, text := range map[string]string{
		"jobbus cluster":        out,
		"the coordinator's log": coord.errs.String() + coord.out.String(),
		"the worker's log":      worker.errs.String() + worker.out.String(),
	} {
		if strings.Contains(text, token) {
			t.Errorf("%s shows the token:\n%s", what, text)
		}
	}
}
