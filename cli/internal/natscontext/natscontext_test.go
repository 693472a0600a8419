package natscontext

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/jobbus/jobbus/internal/testkit"
)

// configHome points XDG_CONFIG_HOME at a fresh directory holding the given contexts
// and selection, as `nats context save` and `nats context select` write them.
func configHome(t *testing.T, selected string, contexts map[string]string) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", home)
	dir := filepath.Join(home, "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, body := range contexts {
		if err := os.WriteFile(filepath.Join(dir, name+".json"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if selected != "" {
		if err := os.WriteFile(filepath.Join(home, "nats", "context.txt"), []byte(selected+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return home
}

func TestLoadAndSelected(t *testing.T) {
	ca := testkit.NewPKI(t).CA
	home := configHome(t, "prod", map[string]string{
		"prod": `{"description":"production","url":"nats://a:4222,nats://b:4222","user":"alice","password":"pw","ca":"` + ca + `","inbox_prefix":"_I.alice","creds":"","nkey":"","cert":"","key":"","token":"","jetstream_domain":"","user_jwt":"","tls_first":false}`,
	})
	sel, err := Selected()
	if err != nil || sel != "prod" {
		t.Fatalf("Selected() = %q, %v", sel, err)
	}
	c, err := Load("prod")
	if err != nil {
		t.Fatal(err)
	}
	if c.URL != "nats://a:4222,nats://b:4222" || c.User != "alice" || c.Password != "pw" || c.CA != ca || c.InboxPrefix != "_I.alice" {
		t.Errorf("loaded %+v", c)
	}
	opts, err := c.Options()
	if err != nil || len(opts) != 3 { // user, ca, inbox prefix
		t.Errorf("Options() = %d options, %v", len(opts), err)
	}
	// A path to a context file works as well as a name.
	byPath, err := Load(filepath.Join(home, "nats", "context", "prod.json"))
	if err != nil || byPath.URL != c.URL {
		t.Errorf("Load(path) = %+v, %v", byPath, err)
	}
}

func TestNoSelection(t *testing.T) {
	configHome(t, "", nil)
	if sel, err := Selected(); err != nil || sel != "" {
		t.Errorf("Selected() = %q, %v; want none", sel, err)
	}
}

func TestLoadErrors(t *testing.T) {
	configHome(t, "", map[string]string{
		"broken":  `{"url":`,
		"domain":  `{"url":"nats://x","jetstream_domain":"hub"}`,
		"nscref":  `{"url":"nats://x","creds":"nsc://op/acc/user"}`,
		"halfTLS": `{"url":"nats://x","cert":"/c.pem"}`,
		"noCA":    `{"url":"nats://x","ca":"/no/such/ca.pem"}`,
	})
	if _, err := Load("missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing context: %v, want ErrNotFound", err)
	}
	if _, err := Load("broken"); err == nil {
		t.Error("broken JSON loaded")
	}
	if _, err := Load("../escape"); err == nil {
		t.Error("a name with .. loaded")
	}
	for _, name := range []string{"domain", "nscref", "halfTLS", "noCA"} {
		c, err := Load(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := c.Options(); err == nil {
			t.Errorf("%s: Options() accepted what jobbus cannot honour", name)
		}
	}
}

func TestNKeyAndCreds(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	// A .creds file as nsc writes it: the user's JWT, then its seed.
	credsFile := filepath.Join(t.TempDir(), "user.creds")
	creds := "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.c2ln\n------END NATS USER JWT------\n\n" +
		"-----BEGIN USER NKEY SEED-----\n" + string(seed) + "\n------END USER NKEY SEED------\n"
	if err := os.WriteFile(credsFile, []byte(creds), 0o600); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(t.TempDir(), "junk.creds")
	if err := os.WriteFile(junk, []byte("not credentials\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	configHome(t, "", map[string]string{
		"nk":           `{"url":"nats://x","nkey":"` + seedFile + `"}`,
		"nkfile":       `{"url":"nats://x","nkey":"file://` + seedFile + `"}`,
		"creds":        `{"url":"nats://x","creds":"` + credsFile + `"}`,
		"missing":      `{"url":"nats://x","nkey":"/no/such.nk"}`,
		"missingCreds": `{"url":"nats://x","creds":"/no/such.creds"}`,
		"badCreds":     `{"url":"nats://x","creds":"` + junk + `"}`,
	})
	for _, name := range []string{"nk", "nkfile", "creds"} {
		c, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		if opts, err := c.Options(); err != nil || len(opts) != 1 {
			t.Errorf("%s: %d options, %v", name, len(opts), err)
		}
	}
	for _, name := range []string{"missing", "missingCreds", "badCreds"} {
		c, _ := Load(name)
		if _, err := c.Options(); err == nil {
			t.Errorf("%s: a missing or bad credentials file was accepted", name)
		}
	}
}
