package cli

import (
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"
)

// loopback reports whether host is a loopback name or address; "" and the
// unspecified addresses (0.0.0.0, ::) mean every interface and are not.
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// warnOpenPorts warns when the TCP ports listen beyond loopback without client
// certificates: PROTOCOL.md has no authentication of its own.
func warnOpenPorts(log *slog.Logger, host string, cfg bridge.Config) {
	if loopback(host) || cfg.TLS != nil && cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert {
		return
	}
	log.Warn("the TCP ports listen beyond loopback without authentication: anyone who reaches "+host+
		" can submit and cancel jobs and act as a worker (PROTOCOL.md has no login); add --bridge-tls-cert, "+
		"--bridge-tls-key and --bridge-tls-client-ca to admit only peers with a certificate, or keep --listen-host on loopback",
		"listen_host", host)
}

// warnOpenNATS warns when serve's embedded NATS listens beyond loopback (on host, at
// url) and lets anyone in.
func warnOpenNATS(log *slog.Logger, host, url string, authenticated bool) {
	if authenticated || loopback(host) {
		return
	}
	log.Warn("the embedded NATS server listens beyond loopback without authentication: anyone who reaches it"+
		" can read, submit and cancel every job and act as the coordinator or a worker; add --nats-user and "+
		"--nats-password (or --nats-token), or --nats-config with users and permissions (see docs/nats-server.conf)",
		"listen_host", host, "url", url)
}

// warnOpenHTTP warns when the HTTP listener (at addr) reaches beyond loopback: it has
// no authentication, and its dashboard cancels and resubmits jobs.
func warnOpenHTTP(log *slog.Logger, addr string) {
	host, _, err := net.SplitHostPort(addr)
	if addr == "" || err == nil && loopback(host) {
		return
	}
	log.Warn("the HTTP listener listens beyond loopback without authentication: anyone who reaches "+addr+
		" can read every job on the dashboard and cancel or resubmit it; keep --http-listen on loopback, "+
		"or put it behind a proxy that authenticates", "http_listen", addr)
}

// embeddedAuth maps --nats-user, --nats-password, --nats-token and --nats-config onto
// the embedded server's options and serve's own connection's.
func embeddedAuth(c *cli.Context) (server []embeddednats.Option, conn []nats.Option, err error) {
	user, pass, token, file := c.String("nats-user"), c.String("nats-password"), c.String("nats-token"), c.String("nats-config")
	switch {
	case token != "" && (user != "" || pass != ""):
		return nil, nil, usageError("--nats-token and --nats-user are two ways to authenticate: give one")
	case (user == "") != (pass == ""):
		return nil, nil, usageError("--nats-user and --nats-password go together: give both")
	}
	if file != "" {
		if _, err := os.Stat(file); err != nil {
			return nil, nil, usageError("--nats-config: %v", err)
		}
		server = append(server, embeddednats.WithConfigFile(file))
	} else if user != "" {
		server = append(server, embeddednats.WithUserPassword(user, pass))
	} else if token != "" {
		server = append(server, embeddednats.WithAuthToken(token))
	}
	switch {
	case user != "":
		conn = append(conn, nats.UserInfo(user, pass))
	case token != "":
		conn = append(conn, nats.Token(token))
	}
	// The global --nats-creds or --nkey authenticate serve's connection too.
	cred, err := credentialOption(c) // natsconn.go
	if err != nil {
		return nil, nil, err
	}
	if cred != nil {
		conn = append(conn, cred)
	}
	return server, conn, nil
}
