package embeddednats

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats-server/v2/server"
)

// noAuthUser is the user a client that gives no credentials becomes once a system user
// exists: it stays in the global account, where jobbus's JetStream lives.
const noAuthUser = "jobbus"

// monitorOptions maps the monitoring port and the system user onto o.
func (c *config) monitorOptions(o *server.Options) error {
	if c.httpListen != "" {
		host, port, err := parseHostPort(c.httpListen)
		if err != nil {
			return fmt.Errorf("embeddednats: monitoring listen address: %w", err)
		}
		o.HTTPHost, o.HTTPPort = host, port
	}
	if c.sysUser == "" && c.sysPassword == "" {
		return nil
	}
	if c.sysUser == "" || c.sysPassword == "" {
		return errors.New("embeddednats: a system user needs a name and a password")
	}
	if c.sysUser == noAuthUser {
		return fmt.Errorf("embeddednats: the system user cannot be called %q, the name of the unauthenticated user", noAuthUser)
	}
	// Only the global and the system account exist, so JetStream stays enabled for the
	// global account exactly as without users.
	sys := server.NewAccount(server.DEFAULT_SYSTEM_ACCOUNT)
	o.Accounts = []*server.Account{sys}
	o.SystemAccount = server.DEFAULT_SYSTEM_ACCOUNT
	o.Users = []*server.User{
		{Username: c.sysUser, Password: c.sysPassword, Account: sys},
		{Username: noAuthUser},
	}
	o.NoAuthUser = noAuthUser
	return nil
}
