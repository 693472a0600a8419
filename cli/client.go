package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// natsDialTimeout bounds a client command's connect (to NATS or to the TCP client
// port): a missing server is reported at once instead of after endless reconnects.
const natsDialTimeout = 2 * time.Second

// session is a client command's connection: the Go client over native NATS (--nats)
// or over the bridge's TCP client port (--connect).
type session struct {
	cl     *client.Client
	nc     *nats.Conn // nil over --connect
	target string     // where the coordinator is, for messages
	stop   func()     // releases the command context connect derived
}

func (s *session) Close() {
	if s.stop != nil {
		defer s.stop()
	}
	_ = s.cl.Close()
	if s.nc != nil {
		s.nc.Close()
	}
}

// connect opens the session of a client command. reconnect lets a long-running command
// (watch) ride out a short NATS outage; one-shot commands fail at once.
func connect(c *cli.Context, reconnect bool, opts ...client.Option) (*session, error) {
	if addr := global(c, "connect"); addr != "" {
		ctx, cancel := context.WithTimeout(c.Context, natsDialTimeout)
		defer cancel()
		cl, err := client.DialTCP(ctx, addr, opts...)
		if err != nil {
			// The dial's own error, without the client's hint: one hint per message.
			if op := (*net.OpError)(nil); errors.Is(err, client.ErrNoCoordinator) && errors.As(err, &op) {
				err = op
			}
			return nil, fmt.Errorf("cannot reach the jobbus client port at %s (is `jobbus serve` or `jobbus bridge` running?): %w", addr, err)
		}
		return &session{cl: cl, target: addr}, nil
	}
	target, err := natsTarget(c, false)
	if err != nil {
		return nil, err
	}
	// NATS refuses a publish the user may not make only in an asynchronous error, and the
	// request would wait out its timeout: end the command's context with that error.
	ctx, refused := context.WithCancelCause(c.Context)
	c.Context = ctx
	nopts := []nats.Option{nats.Name("jobbus " + c.Command.Name), nats.Timeout(natsDialTimeout),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			// A user who may not ask for coordinators' presence (the client asks when
			// none serves) is told what the client tells without it.
			if errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(err.Error(), `"`+protocol.CoordinatorsSubject+`"`) {
				refused(err)
			}
		})}
	if reconnect {
		nopts = append(nopts, nats.MaxReconnects(30))
	} else {
		nopts = append(nopts, nats.NoReconnect())
	}
	nc, err := nats.Connect(target.url, append(nopts, target.opts...)...)
	if err != nil {
		refused(nil)
		return nil, fmt.Errorf("cannot reach NATS at %s (is `jobbus serve` running?): %w", target.where(), err)
	}
	// Said once per command, on stderr, while a request waits for a failover.
	var once sync.Once
	notice := client.WithFailoverNotice(func(msg string) {
		once.Do(func() { fmt.Fprintln(c.App.ErrWriter, "jobbus: "+msg) })
	})
	return &session{cl: client.New(nc, append([]client.Option{notice}, opts...)...), nc: nc, target: nc.ConnectedUrlRedacted(), stop: func() { refused(nil) }}, nil
}

// exitErr maps a client error onto the reference client's exit codes: an overload
// rejection exits 3, everything else 1.
func exitErr(err error) error {
	if err == nil {
		return nil
	}
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return err
	}
	if errors.Is(err, client.ErrRejected) {
		return cli.Exit(err.Error(), ExitOverload)
	}
	msg := err.Error()
	// The bridge's ERROR when no coordinator answers it.
	var se *client.ServerError
	if errors.As(err, &se) && errors.Is(err, client.ErrNoCoordinator) && !strings.Contains(msg, " running?)") {
		msg += " (is `jobbus serve` or `jobbus coordinator` running?)"
	}
	return cli.Exit(msg, ExitError)
}

// args returns the command's positional arguments, exactly one per name, accepting
// flags after them too (urfave/cli v2 stops parsing flags at the first argument): `jobbus wait ID
// --timeout 5s` works like `jobbus wait --timeout 5s ID`.
func args(c *cli.Context, names ...string) ([]string, error) {
	pos, help, err := interspersed(c)
	switch {
	case err != nil:
		return nil, flagError(c, err)
	case help:
		if err := cli.ShowSubcommandHelp(c); err != nil {
			return nil, err
		}
		return nil, cli.Exit("", ExitOK) // the help was the whole answer
	}
	switch {
	case len(pos) == len(names):
	case len(names) == 0:
		return nil, usageError("%s takes no arguments, got %q: see `jobbus %s --help`", c.Command.Name, pos, c.Command.Name)
	default:
		return nil, usageError("%s needs %s, got %d argument(s): see `jobbus %s --help`",
			c.Command.Name, strings.Join(names, " "), len(pos), c.Command.Name)
	}
	return pos, nil
}

// interspersed parses the flags mixed into the command's arguments onto c and returns
// the positional arguments, and whether --help was among them.
func interspersed(c *cli.Context) (pos []string, help bool, _ error) {
	rest := c.Args().Slice()
	for len(rest) > 0 {
		if rest[0] == "--" {
			return append(pos, rest[1:]...), help, nil
		}
		if len(rest[0]) < 2 || rest[0][0] != '-' {
			pos = append(pos, rest[0])
			rest = rest[1:]
			continue
		}
		set, asked, err := commandFlagSet(c)
		if err != nil {
			return nil, false, err
		}
		if err := set.Parse(rest); err != nil {
			return nil, false, err
		}
		help = help || *asked
		var setErr error
		set.Visit(func(f *flag.Flag) {
			if f.Name == "help" || f.Name == "h" {
				return
			}
			if err := c.Set(primaryName(c.Command.Flags, f.Name), f.Value.String()); err != nil && setErr == nil {
				setErr = err
			}
		})
		if setErr != nil {
			return nil, false, setErr
		}
		rest = set.Args()
	}
	return pos, help, nil
}

// commandFlagSet is a flag set of the command's own flags and a --help of its own
// (urfave/cli's HelpFlag is shared by every app and written to as it is applied).
func commandFlagSet(c *cli.Context) (*flag.FlagSet, *bool, error) {
	set := flag.NewFlagSet(c.Command.Name, flag.ContinueOnError)
	set.SetOutput(discard{})
	for _, f := range c.Command.Flags {
		if f == cli.HelpFlag {
			continue
		}
		if err := f.Apply(set); err != nil {
			return nil, nil, err
		}
	}
	help := set.Bool("help", false, "")
	set.BoolVar(help, "h", false, "")
	return set, help, nil
}

// primaryName is the first name of the flag that name (maybe an alias) belongs to:
// urfave/cli reads values under that one.
func primaryName(flags []cli.Flag, name string) string {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f.Names()[0]
			}
		}
	}
	return name
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
