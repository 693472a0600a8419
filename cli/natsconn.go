package cli

import (
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/cli/internal/natscontext"
	"github.com/jobbus/jobbus/internal/natsurl"
)

// natsConn is where and how a command reaches NATS: --nats and the credential and TLS
// flags, over a NATS CLI context (--context, else the one `nats context select` chose);
// each flag wins over the context's field.
type natsConn struct {
	url  string // "" for serve without --nats or --context: it embeds a server
	opts []nats.Option
	// via names the context used, for messages ("" without one).
	via string
}

// natsTarget reads the command's NATS settings. serve embeds its own server unless told
// where NATS is, so for it (embed true) only an explicit --context counts, never the
// selected one.
func natsTarget(c *cli.Context, embed bool) (natsConn, error) {
	var nc natsConn
	name, url := global(c, "context"), global(c, "nats")
	if name == "" && url == "" && !embed {
		selected, err := natscontext.Selected()
		if err != nil {
			return nc, err
		}
		name = selected
	}
	if name != "" {
		ctx, err := natscontext.Load(name)
		if err != nil {
			return nc, usageError("--context: %v", err)
		}
		if url == "" {
			url = ctx.URL
		}
		nc.via = ctx.Name
		if global(c, "nats-creds") != "" || global(c, "nkey") != "" {
			ctx.Creds, ctx.NKey, ctx.UserJWT = "", "", ""
		}
		if global(c, "tls-ca") != "" {
			ctx.CA = ""
		}
		if global(c, "tls-cert") != "" {
			ctx.Cert, ctx.Key = "", ""
		}
		opts, err := ctx.Options()
		if err != nil {
			return nc, usageError("--context: %v", err)
		}
		nc.opts = opts
	}
	if url == "" && !embed {
		url = nats.DefaultURL
	}
	nc.url = url
	flagOpts, err := natsFlagOptions(c)
	if err != nil {
		return nc, err
	}
	nc.opts = append(nc.opts, flagOpts...)
	return nc, nil
}

// natsFlagOptions are the options of --nats-creds, --nkey, --tls-ca, --tls-cert and
// --tls-key.
func natsFlagOptions(c *cli.Context) ([]nats.Option, error) {
	var opts []nats.Option
	cred, err := credentialOption(c)
	if err != nil {
		return nil, err
	}
	if cred != nil {
		opts = append(opts, cred)
	}
	if ca := global(c, "tls-ca"); ca != "" {
		o, err := checked(nats.RootCAs(ca), "--tls-ca "+ca)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	}
	cert, key := global(c, "tls-cert"), global(c, "tls-key")
	switch {
	case cert != "" && key != "":
		o, err := checked(nats.ClientCert(cert, key), "--tls-cert "+cert+", --tls-key "+key)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	case cert != "" || key != "":
		return nil, usageError("--tls-cert and --tls-key go together: give both")
	}
	return opts, nil
}

// credentialOption is the option of --nats-creds or --nkey, nil when neither is given.
func credentialOption(c *cli.Context) (nats.Option, error) {
	switch creds, nkey := global(c, "nats-creds"), global(c, "nkey"); {
	case creds != "" && nkey != "":
		return nil, usageError("--nats-creds and --nkey are two ways to authenticate: give one")
	case creds != "":
		return checked(nats.UserCredentials(creds), "--nats-creds "+creds)
	case nkey != "":
		o, err := nats.NkeyOptionFromSeed(nkey)
		if err != nil {
			return nil, usageError("--nkey %s: %v", nkey, err)
		}
		return o, nil
	}
	return nil, nil
}

// checked is o, or a usage error naming what (the flag and its file) when a file o
// reads is missing or bad: nats.go would only say so at each connection attempt.
func checked(o nats.Option, what string) (nats.Option, error) {
	if err := natscontext.Check(o); err != nil {
		return nil, usageError("%s: %v", what, err)
	}
	return o, nil
}

// where names the NATS a message is about: its redacted URL, and the context it came
// from.
func (n natsConn) where() string {
	if n.via != "" {
		return fmt.Sprintf("%s (context %s)", natsurl.Redact(n.url), n.via)
	}
	return natsurl.Redact(n.url)
}
