package cli

import (
	"os"
	"slices"

	"github.com/urfave/cli/v2"
)

// globalCategory heads the global flags in every command's help.
const globalCategory = "connection and logging (before or after the command name)"

// The global flags in groups, by what they configure.
var (
	// natsGlobals say how to reach NATS.
	natsGlobals = []string{"nats", "context", "nats-creds", "nkey", "tls-ca", "tls-cert", "tls-key"}
	// connectGlobal is the TCP client port, for the client commands.
	connectGlobal = []string{"connect"}
	// logGlobals shape the log of the commands that run a service.
	logGlobals = []string{"log-level", "log-format"}
)

// globalsOf names the global flags each command uses. Only these are shown in its help
// and accepted before or after its name, so that `jobbus --connect host:7071 serve` is
// refused instead of ignored. A command not listed takes them all, until it is.
var globalsOf = map[string][]string{
	"version":     nil,
	"completion":  nil,
	"serve":       slices.Concat(natsGlobals, logGlobals),
	"coordinator": slices.Concat(natsGlobals, logGlobals),
	"bridge":      slices.Concat(natsGlobals, logGlobals),
	"dashboard":   slices.Concat(natsGlobals, logGlobals),
	"worker":      slices.Concat(natsGlobals, logGlobals),
	"bench":       slices.Concat(natsGlobals, connectGlobal),
	"submit":      slices.Concat(natsGlobals, connectGlobal),
	"status":      slices.Concat(natsGlobals, connectGlobal),
	"wait":        slices.Concat(natsGlobals, connectGlobal),
	"cancel":      slices.Concat(natsGlobals, connectGlobal),
	"jobs":        slices.Concat(natsGlobals, connectGlobal),
	"workers":     slices.Concat(natsGlobals, connectGlobal),
	"types":       slices.Concat(natsGlobals, connectGlobal),
	"queue":       slices.Concat(natsGlobals, connectGlobal),
	"watch":       slices.Concat(natsGlobals, connectGlobal),
	"cluster":     natsGlobals,
	"logs":        natsGlobals, // job logs are read from JetStream, never the TCP port
	"schedule":    slices.Concat(natsGlobals, connectGlobal),
	"limit":       slices.Concat(natsGlobals, connectGlobal),
	"workflow":    slices.Concat(natsGlobals, connectGlobal),
	"mu-node":     logGlobals, // it dials a Mu port (its own --connect), never NATS
}

// globalFlags are the flags every command takes, before or after its name. Each call
// builds new flags, as a flag keeps the state of the flag set it was applied to.
func globalFlags() []cli.Flag {
	str := func(name, usage, def string) cli.Flag {
		return &cli.StringFlag{Name: name, Category: globalCategory, Usage: usage, Value: def, EnvVars: env(name)}
	}
	return []cli.Flag{
		str("nats", "NATS server URL: client commands and workers default to the --context's, else nats://127.0.0.1:4222; serve joins it instead of embedding one", ""),
		str("context", "a NATS CLI context (as nats context ls lists them, or a path to a context .json): its URL, credentials and TLS, each overridden by the flag of its own; without --nats and --context, the one nats context select chose (serve embeds NATS instead); see docs/operations.md", ""),
		str("nats-creds", "NATS credentials (.creds) file", ""),
		str("nkey", "NATS NKey seed file, for a user that authenticates with an nkey", ""),
		str("tls-ca", "PEM file of the CA certificates that sign the NATS server's certificate", ""),
		str("tls-cert", "PEM client certificate for NATS servers that verify clients (with --tls-key)", ""),
		str("tls-key", "PEM private key of --tls-cert", ""),
		str("connect", "client commands: talk to the TCP client port at host:port (e.g. 127.0.0.1:7071) instead of NATS", ""),
		str("log-level", "debug, info, warn or error", "info"),
		str("log-format", "text or json", "text"),
	}
}

func isGlobal(name string) bool {
	for _, f := range globalFlags() {
		if f.Names()[0] == name {
			return true
		}
	}
	return false
}

// withGlobalFlags lets each command take its global flags after its name too
// (urfave/cli v2 does not carry them down), except a name the command gives a meaning
// of its own, as worker does --connect; and it refuses, before the command runs, a
// global flag given before the name that the command does not use.
func withGlobalFlags(cmds []*cli.Command) []*cli.Command {
	for _, cmd := range cmds {
		uses, listed := globalsOf[cmd.Name]
		if !listed {
			for _, g := range globalFlags() {
				uses = append(uses, g.Names()[0])
			}
		}
		withGlobals(cmd, uses)
	}
	return cmds
}

// subcommandsWithGlobals is withGlobalFlags for the subcommands of parent (queue,
// limit, workflow), which use the global flags their parent uses: looked up by their
// own names ("ls", "set"), they would take them all.
func subcommandsWithGlobals(parent string, cmds []*cli.Command) []*cli.Command {
	for _, cmd := range cmds {
		withGlobals(cmd, globalsOf[parent])
	}
	return cmds
}

// withGlobals gives cmd the global flags named in uses, and refuses the others.
func withGlobals(cmd *cli.Command, uses []string) {
flags:
	for _, g := range globalFlags() {
		name := g.Names()[0]
		if !slices.Contains(uses, name) {
			continue
		}
		for _, f := range cmd.Flags {
			if f.Names()[0] == name {
				continue flags
			}
		}
		cmd.Flags = append(cmd.Flags, g)
	}
	cmd.OnUsageError = onUsageError
	before := cmd.Before
	cmd.Before = func(c *cli.Context) error {
		if err := refuseUnusedGlobals(c, uses); err != nil {
			return err
		}
		if before != nil {
			return before(c)
		}
		return nil
	}
}

// refuseUnusedGlobals refuses a global flag given before the command's name that the
// command does not use. One set in the environment is shared configuration, not a
// mistake, and stays quietly unused.
func refuseUnusedGlobals(c *cli.Context, uses []string) error {
	for _, f := range globalFlags() {
		name := f.Names()[0]
		if slices.Contains(uses, name) || !slices.ContainsFunc(c.Lineage()[1:], func(cc *cli.Context) bool { return givenOnCommandLine(cc, name) }) {
			continue
		}
		return usageError("--%s does not apply to `jobbus %s` (see `jobbus %s --help`)", name, c.Command.Name, c.Command.Name)
	}
	return nil
}

// givenOnCommandLine reports whether the flag was set on c's part of the command line,
// not only by its environment variable (the flag's own: JOBBUS_SUBMIT_TEXT for
// submit's --text). Where both set it to the same value, which wins makes no
// difference.
func givenOnCommandLine(c *cli.Context, name string) bool {
	if c.Command == nil || !slices.Contains(c.LocalFlagNames(), name) {
		return false
	}
	for _, f := range c.Command.Flags {
		ef, ok := f.(cli.DocGenerationFlag)
		if !ok || !slices.Contains(f.Names(), name) {
			continue
		}
		for _, e := range ef.GetEnvVars() {
			if v, fromEnv := os.LookupEnv(e); fromEnv && c.String(name) == v {
				return false
			}
		}
	}
	return true
}

// global reads a global flag: the value given after the command's name, else before
// it, else its environment variable, else its default.
func global(c *cli.Context, name string) string {
	for _, cc := range c.Lineage() {
		if givenOnCommandLine(cc, name) {
			return cc.String(name)
		}
	}
	return c.String(name)
}
