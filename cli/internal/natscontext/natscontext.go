// Package natscontext reads the connection contexts that the NATS CLI (`nats context
// save`, `nats context select`) keeps, so jobbus connects wherever `nats` does.
//
// The files are those of NATS ADR-21: ~/.config/nats/context/NAME.json (the config
// directory follows XDG_CONFIG_HOME), and ~/.config/nats/context.txt naming the selected
// context. github.com/nats-io/jsm.go/natscontext reads them too, but it brings the
// whole JetStream management module with it; the format is a flat JSON object, so
// jobbus reads it itself.
package natscontext

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
)

// ErrNotFound: no context of that name is saved.
var ErrNotFound = errors.New("natscontext: no such context")

// Context is a saved context: the fields of ADR-21 that a NATS client connection uses.
type Context struct {
	Name        string `json:"-"`
	Path        string `json:"-"` // the file it was read from
	Description string `json:"description"`
	URL         string `json:"url"`
	Token       string `json:"token"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	InboxPrefix string `json:"inbox_prefix"`
	UserJWT     string `json:"user_jwt"`
	TLSFirst    bool   `json:"tls_first"`
	// JetStreamDomain and JetStreamAPIPrefix are read so that a context which needs them
	// is refused rather than half-used: jobbus's KV buckets live in the account's own
	// JetStream.
	JetStreamDomain    string `json:"jetstream_domain"`
	JetStreamAPIPrefix string `json:"jetstream_api_prefix"`
}

// ConfigDir is the NATS CLI's configuration directory: $XDG_CONFIG_HOME/nats, else
// ~/.config/nats.
func ConfigDir() (string, error) {
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "nats"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("natscontext: %w", err)
	}
	return filepath.Join(home, ".config", "nats"), nil
}

// Selected is the name of the context `nats context select` chose, or "" when none is.
func Selected() (string, error) {
	dir, err := ConfigDir()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, "context.txt"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("natscontext: selected context: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Load reads the context named name, or the file name when it is a path to a .json
// file (as `nats --context ./ci.json` accepts).
func Load(name string) (*Context, error) {
	path := name
	if !strings.ContainsRune(name, os.PathSeparator) && !strings.HasSuffix(name, ".json") {
		if name == "" || strings.Contains(name, "..") {
			return nil, fmt.Errorf("natscontext: invalid context name %q", name)
		}
		dir, err := ConfigDir()
		if err != nil {
			return nil, err
		}
		path = filepath.Join(dir, "context", name+".json")
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s (no %s; `nats context ls` lists the saved ones)", ErrNotFound, name, path)
	}
	if err != nil {
		return nil, fmt.Errorf("natscontext: %w", err)
	}
	ctx := &Context{Name: name, Path: path}
	if err := json.Unmarshal(b, ctx); err != nil {
		return nil, fmt.Errorf("natscontext: %s: %w", path, err)
	}
	return ctx, nil
}

// Options are the nats.go options of the context's credentials and TLS. Its URL is
// not among them: the caller decides whether a flag overrides it.
func (c *Context) Options() ([]nats.Option, error) {
	if c.JetStreamDomain != "" || c.JetStreamAPIPrefix != "" {
		return nil, fmt.Errorf("natscontext: context %s sets a JetStream domain or API prefix, which jobbus does not use: keep jobbus in an account with its own JetStream", c.Name)
	}
	var opts []nats.Option
	switch {
	case c.UserJWT != "" && c.NKey != "":
		seed, err := readCredential(c.NKey)
		if err != nil {
			return nil, fmt.Errorf("natscontext: context %s: nkey: %w", c.Name, err)
		}
		opts = append(opts, nats.UserJWTAndSeed(c.UserJWT, strings.TrimSpace(string(seed))))
	case c.Creds != "":
		path, err := credentialPath(c.Creds)
		if err != nil {
			return nil, fmt.Errorf("natscontext: context %s: creds: %w", c.Name, err)
		}
		o := nats.UserCredentials(path)
		if err := Check(o); err != nil {
			return nil, fmt.Errorf("natscontext: context %s: creds %s: %w", c.Name, path, err)
		}
		opts = append(opts, o)
	case c.NKey != "":
		path, err := credentialPath(c.NKey)
		if err != nil {
			return nil, fmt.Errorf("natscontext: context %s: nkey: %w", c.Name, err)
		}
		o, err := nats.NkeyOptionFromSeed(path)
		if err != nil {
			return nil, fmt.Errorf("natscontext: context %s: nkey: %w", c.Name, err)
		}
		opts = append(opts, o)
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.Token != "" {
		opts = append(opts, nats.Token(c.Token))
	}
	if c.CA != "" {
		o := nats.RootCAs(expandHome(c.CA))
		if err := Check(o); err != nil {
			return nil, fmt.Errorf("natscontext: context %s: ca %s: %w", c.Name, c.CA, err)
		}
		opts = append(opts, o)
	}
	if c.Cert != "" || c.Key != "" {
		if c.Cert == "" || c.Key == "" {
			return nil, fmt.Errorf("natscontext: context %s sets only one of cert and key", c.Name)
		}
		o := nats.ClientCert(expandHome(c.Cert), expandHome(c.Key))
		if err := Check(o); err != nil {
			return nil, fmt.Errorf("natscontext: context %s: cert %s, key %s: %w", c.Name, c.Cert, c.Key, err)
		}
		opts = append(opts, o)
	}
	if c.TLSFirst {
		opts = append(opts, nats.TLSHandshakeFirst())
	}
	if c.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
	}
	return opts, nil
}

// Check applies o to scratch options, and reads the credentials it sets, so that a file
// it names (a CA, a client certificate and key, a .creds file) that is missing or bad
// is refused at once: nats.go would report it only at each connection attempt, and a
// service that waits for NATS would wait for ever.
func Check(o nats.Option) error {
	scratch := nats.GetDefaultOptions()
	if err := o(&scratch); err != nil {
		return err
	}
	if scratch.UserJWT != nil {
		if _, err := scratch.UserJWT(); err != nil {
			return err
		}
	}
	if scratch.SignatureCB != nil {
		if _, err := scratch.SignatureCB([]byte("check")); err != nil {
			return err
		}
	}
	return nil
}

// credentialPath is the file a creds or nkey field names: a bare path or a file:// URI.
// The schemes that run other programs (nsc://, op://) or carry the secret (env://,
// data:) are the NATS CLI's to resolve.
func credentialPath(v string) (string, error) {
	if !strings.Contains(v, "://") && !strings.HasPrefix(v, "data:") {
		return expandHome(v), nil
	}
	u, err := url.Parse(v)
	if err != nil {
		return "", err
	}
	if u.Scheme == "file" {
		return u.Path, nil
	}
	return "", fmt.Errorf("%s: jobbus reads credential files only (a path or file://); give the file with --nats-creds or --nkey", u.Scheme+":")
}

func readCredential(v string) ([]byte, error) {
	path, err := credentialPath(v)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(path)
}

// expandHome resolves a leading ~/, which the NATS CLI writes into contexts.
func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return p
}
