package embeddednats

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats-server/v2/server"
)

// WithUserPassword makes the server require this user name and password of every
// client (the user lands in the account that holds jobbus's JetStream, with every
// permission). Without it, and without WithAuthToken or WithConfigFile, any client
// that reaches the listen address gets in: keep that address on loopback.
func WithUserPassword(user, password string) Option {
	return func(c *config) { c.user, c.password = user, password }
}

// WithAuthToken makes the server require this token of every client.
func WithAuthToken(token string) Option {
	return func(c *config) { c.token = token }
}

// WithConfigFile reads a nats-server configuration file (nats-server -c): accounts,
// users and their permissions, nkeys, a JWT resolver, TLS, limits. What the file sets
// wins; the other options fill in only what it leaves unset (listen address, store
// directory, JetStream limits, server name), and JetStream is always on. A file with
// users needs serve's own connection to give one's credentials.
func WithConfigFile(path string) Option {
	return func(c *config) { c.configFile = path }
}

// Authenticated reports whether clients must give credentials to connect: the options
// asked for a user, a token or a configuration file with authentication.
func (s *Server) Authenticated() bool { return s.authenticated }

// ListenHost is the host the client port listens on ("0.0.0.0" or "::" for every
// interface).
func (s *Server) ListenHost() string { return s.listenHost }

func authenticated(o *server.Options) bool {
	return o.Username != "" || o.Authorization != "" || len(o.Users) > 0 && o.NoAuthUser == "" ||
		len(o.Nkeys) > 0 || len(o.TrustedOperators) > 0 || o.AuthCallout != nil
}

// noAnonymousAccount is an account nobody uses (see authOptions).
const noAnonymousAccount = "JOBBUS_NO_ANONYMOUS"

// authOptions maps WithUserPassword and WithAuthToken onto o; called after the
// system user's options, whose unauthenticated user it removes.
func (c *config) authOptions(o *server.Options) error {
	switch {
	case c.user == "" && c.password == "" && c.token == "":
		return nil
	case c.configFile != "":
		return errors.New("embeddednats: a user or token with a configuration file: put the users in the file")
	case c.token != "" && (c.user != "" || c.password != ""):
		return errors.New("embeddednats: a token and a user are two ways to authenticate: give one")
	case c.token != "" && len(o.Users) > 0:
		return errors.New("embeddednats: a token cannot go with the system user (nats-server allows users or a token); use a user and password")
	case c.token != "":
		o.Authorization = c.token
		return nil
	case c.user == "" || c.password == "":
		return errors.New("embeddednats: a user needs a name and a password")
	case c.user == c.sysUser:
		return fmt.Errorf("embeddednats: the user %q is also the system user: give them different names", c.user)
	}
	user := &server.User{Username: c.user, Password: c.password}
	if len(o.Users) == 0 {
		o.Users = []*server.User{user}
		return nil
	}
	// With the system user: this user replaces the unauthenticated one, in the global
	// account, and clients without credentials are refused.
	users := []*server.User{user}
	for _, u := range o.Users {
		if u.Username != noAuthUser {
			users = append(users, u)
		}
	}
	o.Users, o.NoAuthUser = users, ""
	// nats-server adds a user for clients without credentials by itself when the only
	// accounts are the global and the system one (server.go, "sysAccOnlyNoAuthUser"):
	// a third, empty account keeps it from doing so.
	o.Accounts = append(o.Accounts, server.NewAccount(noAnonymousAccount))
	return nil
}

// fileOptions reads the configuration file and fills in from o what it leaves unset.
func (c *config) fileOptions(o *server.Options) (*server.Options, error) {
	if c.sysUser != "" || c.sysPassword != "" {
		return nil, errors.New("embeddednats: a system user with a configuration file: put the system account in the file")
	}
	fo, err := server.ProcessConfigFile(c.configFile)
	if err != nil {
		return nil, fmt.Errorf("embeddednats: configuration file: %w", err)
	}
	// nats-server listens on every interface when no host is given: here the listen
	// option's host (loopback by default) fills in, as for everything else left out.
	if fo.Host == "" {
		fo.Host = o.Host
	}
	if fo.Port == 0 {
		fo.Port = o.Port
	}
	if fo.StoreDir == "" {
		fo.StoreDir = o.StoreDir
	}
	c.storeDir = fo.StoreDir   // the lock follows the store
	fo.JetStream = o.JetStream // always, but on a leaf node (WithoutJetStream)
	// Pings, a cluster and leaf nodes the file leaves out come from the options.
	if fo.PingInterval == 0 && fo.MaxPingsOut == 0 {
		fo.PingInterval, fo.MaxPingsOut = o.PingInterval, o.MaxPingsOut
	}
	if fo.Cluster.Port == 0 && len(fo.Routes) == 0 {
		fo.Cluster, fo.Routes = o.Cluster, o.Routes
	}
	if fo.LeafNode.Port == 0 && len(fo.LeafNode.Remotes) == 0 {
		fo.LeafNode = o.LeafNode
	}
	if fo.JetStreamMaxStore == 0 {
		fo.JetStreamMaxStore = o.JetStreamMaxStore
	}
	if fo.JetStreamMaxMemory == 0 {
		fo.JetStreamMaxMemory = o.JetStreamMaxMemory
	}
	if fo.ServerName == "" {
		fo.ServerName = o.ServerName
	}
	if fo.HTTPPort == 0 {
		fo.HTTPHost, fo.HTTPPort = o.HTTPHost, o.HTTPPort
	}
	fo.SyncAlways = fo.SyncAlways || o.SyncAlways
	fo.NoLog, fo.NoSigs, fo.DisableJetStreamBanner = true, true, true
	return fo, nil
}

// needsGlobalJetStream reports options with the account of authOptions: with three
// accounts, nats-server no longer turns JetStream on for the global account, which
// holds jobbus's, by itself.
func needsGlobalJetStream(o *server.Options) bool {
	for _, a := range o.Accounts {
		if a.Name == noAnonymousAccount {
			return true
		}
	}
	return false
}

func enableGlobalJetStream(ns *server.Server) error {
	if err := ns.GlobalAccount().EnableJetStream(nil, nil); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return fmt.Errorf("embeddednats: enable JetStream for the global account: %w", err)
	}
	return nil
}
