package embeddednats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/internal/natsurl"
	"github.com/jobbus/jobbus/internal/startup"
)

// DialOption configures Dial.
type DialOption func(*dialConfig)

type dialConfig struct {
	opts []nats.Option
	wait bool
	log  *slog.Logger
}

// WithWait makes Dial wait, with backoff, until a server answers and its JetStream
// does, logging to log what it waits for, instead of failing at the first refusal: a
// service started together with its cluster (or before it) waits for the cluster. ctx
// still bounds the wait. Authentication failures, a server without JetStream and a
// user who may not use it (ErrNoJetStreamAccess) fail at once.
func WithWait(log *slog.Logger) DialOption {
	return func(c *dialConfig) { c.wait, c.log = true, log }
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
		return nil, fmt.Errorf("embeddednats: dial %s: %w", natsurl.Redact(url), err)
	}
	var cfg dialConfig
	for _, o := range opts {
		o(&cfg)
	}
	if !cfg.wait {
		return dialOnce(ctx, url, cfg.opts)
	}
	var nc *nats.Conn
	err := startup.Wait(ctx, cfg.log, "NATS with JetStream at "+natsurl.Redact(url), func(ctx context.Context) error {
		var err error
		nc, err = dialOnce(ctx, url, cfg.opts)
		var hint *hintError
		if errors.As(err, &hint) || errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
			errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrNkeysNotSupported) {
			return startup.Permanent(err)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return nc, nil
}

func dialOnce(ctx context.Context, url string, opts []nats.Option) (*nats.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		opts = append([]nats.Option{nats.Timeout(time.Until(dl))}, opts...)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("embeddednats: connect %s: %w (is a nats-server running there?)", natsurl.Redact(url), err)
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
			msg:      fmt.Sprintf("embeddednats: JetStream is not enabled on %s (start nats-server with -js)", natsurl.Redact(url)),
			sentinel: ErrNoJetStream,
			cause:    err,
		}
	}
	// NATS refuses a publish the user may not make only in an asynchronous error, which
	// is the connection's last, and the request times out. Waiting will not give the
	// user the permission: say which one it lacks, at once.
	if le := nc.LastError(); errors.Is(le, nats.ErrPermissionViolation) && strings.Contains(le.Error(), `"$JS.API.`) {
		return &hintError{
			msg: fmt.Sprintf("embeddednats: the user on %s may not use JetStream (%v): give it a user with JetStream access in the account (docs/security.md)",
				natsurl.Redact(url), le),
			sentinel: ErrNoJetStreamAccess,
			cause:    le,
		}
	}
	return fmt.Errorf("embeddednats: JetStream account info on %s: %w", natsurl.Redact(url), err)
}

// ServiceOptions are the nats.go options of a long-running service (coordinator,
// bridge, worker): reconnect forever, to any server of the cluster, and find a server
// that stopped answering (frozen, or cut off) within about PingInterval *
// (MaxPingsOut + 1) instead of nats.go's default of 2 minutes * 2, so a service moves to
// another server of the cluster in seconds.
func ServiceOptions() []nats.Option {
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOut),
	}
}
