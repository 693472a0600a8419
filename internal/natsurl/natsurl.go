// Package natsurl shows NATS URLs without the secrets they may carry, for logs and
// messages.
package natsurl

import (
	"net/url"
	"strings"

	"github.com/nats-io/nats.go"
)

// Redact hides the passwords and tokens in a comma-separated list of NATS URLs, for
// logs and messages.
func Redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		parts[i] = redactURL(p)
	}
	return strings.Join(parts, ",")
}

// redactURL hides the password or token of one URL. nats.go takes one without a
// scheme (user:pw@host:4222) as nats://, so it is read as one; one that does not parse
// loses everything before its last @, where its credentials would be.
func redactURL(p string) string {
	s, bare := strings.TrimSpace(p), !strings.Contains(p, "://")
	if bare {
		s = "nats://" + s
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		at := strings.LastIndex(p, "@")
		if at < 0 {
			return p
		}
		start := strings.Index(p, "://") + len("://")
		if start < len("://") {
			start = 0
		}
		return p[:start] + "xxxxx" + p[at:]
	case u.User == nil:
		return p
	}
	if _, hasPass := u.User.Password(); hasPass {
		s = u.Redacted()
	} else {
		u.User = url.User("xxxxx") // a lone user part may be a token
		s = u.String()
	}
	if bare {
		s = strings.TrimPrefix(s, "nats://")
	}
	return s
}

// Connected is nc's connected URL with its password or token hidden, "" while it is not
// connected. nats.go's ConnectedUrlRedacted hides a password only, and shows the token
// of nats://TOKEN@host.
func Connected(nc *nats.Conn) string { return Redact(nc.ConnectedUrl()) }
