package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/natsurl"
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
	// A command that does not take --connect (cluster, logs) reads NATS whatever
	// JOBBUS_CONNECT says: set in the environment, it is the client commands'.
	if addr := global(c, "connect"); addr != "" && commandTakes(c, "connect") {
		ctx, cancel := context.WithTimeout(c.Context, natsDialTimeout)
		defer cancel()
		cl, err := client.DialTCP(ctx, addr, opts...)
		if err != nil {
			return nil, fmt.Errorf("cannot reach the jobbus client port at %s (is `jobbus serve` or `jobbus bridge` running?)%s", addr, dialCause(err))
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
			// A user who may not ask for coordinators' presence, nor hear a new leader's
			// announcement (the client asks and listens while a failover may be under
			// way), is told what the client tells without them.
			if errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(err.Error(), `"`+protocol.CoordinatorsSubject+`"`) &&
				!strings.Contains(err.Error(), `"`+protocol.LeaderSubject+`"`) {
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
	tp, flush, err := tracerFromEnv(c, "client", nil)
	if err != nil {
		nc.Close()
		refused(nil)
		return nil, err
	}
	opts = append([]client.Option{notice, client.WithTracerProvider(tp)}, opts...)
	return &session{cl: client.New(nc, opts...), nc: nc, target: natsurl.Connected(nc), stop: func() { flush(); refused(nil) }}, nil
}

// dialCause is what to add to "cannot reach" about err: nothing when the port refused
// (nothing listens: the hint says it all), else the dial's own error, without the
// client's hint, which the message already gives.
func dialCause(err error) string {
	var op *net.OpError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return ""
	case errors.As(err, &op):
		return ": " + op.Error()
	}
	return ": " + err.Error()
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
	words := make([]string, len(pos))
	for i, p := range pos {
		words[i] = p.word
	}
	switch {
	case len(pos) == len(names):
	case len(names) == 0:
		return nil, usageError("%s takes no arguments, got %q: see `jobbus %s --help`", cmdName(c), words, cmdName(c))
	case len(pos) > len(names):
		return nil, usageError("%s needs %s, got %d arguments: %s", cmdName(c), strings.Join(names, " "), len(pos), strays(c, pos[len(names):]))
	default:
		return nil, usageError("%s needs %s, got %d argument(s): see `jobbus %s --help`",
			cmdName(c), strings.Join(names, " "), len(pos), cmdName(c))
	}
	// An empty argument is most often a shell variable that was never set, as
	// `jobbus status "$id"` in a new terminal: asking for it would answer "Unknown job: ".
	for i, w := range words {
		if strings.TrimSpace(w) == "" {
			return nil, usageError("%s: %s is empty (a shell variable that is not set?)", cmdName(c), names[i])
		}
	}
	return words, nil
}

// positional is a command's argument, with the value flag written right before it:
// in `submit sha256 --text hello jobbus`, "jobbus" follows --text's value "hello".
type positional struct {
	word      string
	flag, val string // the value flag and its value right before word, if any
	afterWord bool   // word directly follows another positional
}

// strays says what to do about the arguments beyond those the command takes: most
// often a value with spaces that lost its quotes.
func strays(c *cli.Context, extra []positional) string {
	quoted := make([]string, len(extra))
	for i, p := range extra {
		quoted[i] = strconv.Quote(p.word)
	}
	what, it := quoted[0]+" is a stray word", "it belongs"
	if len(extra) > 1 {
		what, it = strings.Join(quoted, ", ")+" are stray words", "they belong"
	}
	if first := extra[0]; first.flag != "" {
		value := []string{first.val, first.word}
		for _, p := range extra[1:] {
			if !p.afterWord {
				break
			}
			value = append(value, p.word)
		}
		return fmt.Sprintf("%s; if %s to --%s, quote the value: --%s %s", what, it, first.flag, first.flag, shellQuote(strings.Join(value, " ")))
	}
	return fmt.Sprintf("%s; quote a value that has spaces (see `jobbus %s --help`)", what, cmdName(c))
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if !strings.ContainsAny(s, "\"$`\\!") {
		return `"` + s + `"`
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// interspersed parses the flags mixed into the command's arguments onto c and returns
// the positional arguments, and whether --help was among them.
func interspersed(c *cli.Context) (pos []positional, help bool, _ error) {
	rest := c.Args().Slice()
	var flagBefore, valBefore string // the value flag the parse consumed last
	afterWord := false
	for len(rest) > 0 {
		if rest[0] == "--" {
			for _, w := range rest[1:] {
				pos = append(pos, positional{word: w})
			}
			return pos, help, nil
		}
		if len(rest[0]) < 2 || rest[0][0] != '-' {
			pos = append(pos, positional{word: rest[0], flag: flagBefore, val: valBefore, afterWord: afterWord})
			flagBefore, valBefore, afterWord = "", "", true
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
		flagBefore, valBefore = lastValueFlag(set, rest[:len(rest)-len(set.Args())])
		afterWord = false
		rest = set.Args()
	}
	return pos, help, nil
}

// lastValueFlag is the flag that took the last of the tokens a parse consumed as its
// value (`--text hello`, `--text=hello`), or "" when they end with a boolean flag.
func lastValueFlag(set *flag.FlagSet, consumed []string) (name, value string) {
	isValueFlag := func(name string) bool {
		f := set.Lookup(name)
		if f == nil {
			return false
		}
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		return !ok || !b.IsBoolFlag()
	}
	n := len(consumed)
	if n == 0 {
		return "", ""
	}
	if last := strings.TrimLeft(consumed[n-1], "-"); strings.HasPrefix(consumed[n-1], "-") {
		if k, v, ok := strings.Cut(last, "="); ok && isValueFlag(k) {
			return k, v
		}
		return "", ""
	}
	if n >= 2 && strings.HasPrefix(consumed[n-2], "-") {
		if k := strings.TrimLeft(consumed[n-2], "-"); !strings.Contains(k, "=") && isValueFlag(k) {
			return k, consumed[n-1]
		}
	}
	return "", ""
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
