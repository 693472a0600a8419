package embeddednats_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/embeddednats"
)

// TestAuthentication: with a user, a token or a configuration file, a client without
// credentials is refused and one with them gets in, JetStream and all; without, anyone
// gets in. Authenticated says which.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(conf, []byte("authorization { user: file, password: pw }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts []embeddednats.Option
		cred []nats.Option // nil: the server is open
	}{
		{"Open", nil, nil},
		{"UserPassword", []embeddednats.Option{embeddednats.WithUserPassword("u", "p")}, []nats.Option{nats.UserInfo("u", "p")}},
		{"UserAndSystemUser", []embeddednats.Option{embeddednats.WithUserPassword("u", "p"), embeddednats.WithSystemUser("sys", "s")}, []nats.Option{nats.UserInfo("u", "p")}},
		{"Token", []embeddednats.Option{embeddednats.WithAuthToken("tok")}, []nats.Option{nats.Token("tok")}},
		{"ConfigFile", []embeddednats.Option{embeddednats.WithConfigFile(conf)}, []nats.Option{nats.UserInfo("file", "pw")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := start(t, "", tc.opts...)
			if srv.Authenticated() != (tc.cred != nil) {
				t.Fatalf("Authenticated() = %v", srv.Authenticated())
			}
			if !strings.HasPrefix(srv.ListenHost(), "127.0.0.1") {
				t.Errorf("listens on %q, want loopback", srv.ListenHost())
			}
			anon, err := nats.Connect(srv.ClientURL())
			if tc.cred == nil {
				if err != nil {
					t.Fatalf("open server refused an anonymous client: %v", err)
				}
				anon.Close()
				return
			}
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
				if anon != nil {
					anon.Close()
				}
				t.Fatalf("anonymous client: %v, want an authorization violation", err)
			}
			for name, dial := range map[string]func() (*nats.Conn, error){
				"tcp":        func() (*nats.Conn, error) { return nats.Connect(srv.ClientURL(), tc.cred...) },
				"in-process": func() (*nats.Conn, error) { return srv.Connect(tc.cred...) },
			} {
				nc := connect(t, dial)
				kvRoundTrip(t, nc, "AUTH_"+strings.ReplaceAll(name, "-", "_"), 1)
			}
		})
	}
}

func TestAuthenticationConflicts(t *testing.T) {
	t.Parallel()
	conf := filepath.Join(t.TempDir(), "server.conf")
	if err := os.WriteFile(conf, []byte("port: -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]embeddednats.Option{
		"TokenAndUser":       {embeddednats.WithAuthToken("t"), embeddednats.WithUserPassword("u", "p")},
		"TokenAndSystemUser": {embeddednats.WithAuthToken("t"), embeddednats.WithSystemUser("sys", "s")},
		"UserWithoutPass":    {embeddednats.WithUserPassword("u", "")},
		"UserIsSystemUser":   {embeddednats.WithUserPassword("sys", "p"), embeddednats.WithSystemUser("sys", "s")},
		"FileAndUser":        {embeddednats.WithConfigFile(conf), embeddednats.WithUserPassword("u", "p")},
		"FileAndSystemUser":  {embeddednats.WithConfigFile(conf), embeddednats.WithSystemUser("sys", "s")},
		"MissingFile":        {embeddednats.WithConfigFile(conf + ".missing")},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts = append([]embeddednats.Option{embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir())}, opts...)
			srv, err := embeddednats.Start(context.Background(), opts...)
			if err == nil {
				shutdown(t, srv)
				t.Fatal("started")
			}
		})
	}
}
