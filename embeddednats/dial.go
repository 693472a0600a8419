package embeddednats

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DialOption configures Dial.
type DialOption func(*dialConfig)

type dialConfig struct {
	opts []nats.Option
}

// WithUserInfo authenticates with a user name and password.
func WithUserInfo(user, pass string) DialOption {
	return WithNATSOptions(nats.UserInfo(user, pass))
}

// WithToken authenticates with a token.
func WithToken(token string) DialOption {
	return WithNATSOptions(nats.Token(token))
}

// WithCredsFile authenticates with a NATS credentials (.creds) file.
func WithCredsFile(path string) DialOption {
	return WithNATSOptions(nats.UserCredentials(path))
}

// WithRootCA trusts the PEM CA certificates in path for TLS.
func WithRootCA(path string) DialOption {
	return WithNATSOptions(nats.RootCAs(path))
}

// WithName sets the connection name the server shows in its monitoring.
func WithName(name string) DialOption {
	return WithNATSOptions(nats.Name(name))
}

// WithNATSOptions passes nats.go options through, applied after the others.
func WithNATSOptions(opts ...nats.Option) DialOption {
	return func(c *dialConfig) { c.opts = append(c.opts, opts...) }
}

// Dial connects to the NATS server(s) at url (comma-separated for several)
// and checks that JetStream is enabled there, returning ErrNoJetStream if it
// is not. ctx's deadline, if any, bounds the connect and the check.
func Dial(ctx context.Context, url string, opts ...DialOption) (*nats.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("embeddednats: dial %s: %w", redact(url), err)
	}
	var cfg dialConfig
	if dl, ok := ctx.Deadline(); ok {
		cfg.opts = append(cfg.opts, nats.Timeout(time.Until(dl)))
	}
	for _, o := range opts {
		o(&cfg)
	}
	nc, err := nats.Connect(url, cfg.opts...)
	if err != nil {
		return nil, fmt.Errorf("embeddednats: connect %s: %w (is a nats-server running there?)", redact(url), err)
	}
	if err := checkJetStream(ctx, nc, url); err != nil {
		nc.Close()
		return nil, err
	}
	return nc, nil
}

func checkJetStream(ctx context.Context, nc *nats.Conn, url string) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("embeddednats: jetstream: %w", err)
	}
	_, err = js.AccountInfo(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return &hintError{
			msg:      fmt.Sprintf("embeddednats: JetStream is not enabled on %s (start nats-server with -js)", redact(url)),
			sentinel: ErrNoJetStream,
			cause:    err,
		}
	default:
		return fmt.Errorf("embeddednats: JetStream account info on %s: %w", redact(url), err)
	}
}

// redact hides passwords and tokens in a comma-separated URL list.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil || u.User == nil {
			continue
		}
		if _, hasPass := u.User.Password(); hasPass {
			parts[i] = u.Redacted()
		} else {
			u.User = url.User("xxxxx") // a lone user part may be a token
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
