// Package cli is the jobbus command line: the urfave/cli/v2 application that maps flags
// (each also read from JOBBUS_<FLAG>) onto the configuration of the other packages.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/internal/version"
)

// Exit codes, as the reference client's.
const (
	ExitOK       = 0
	ExitError    = 1
	ExitUsage    = 2
	ExitOverload = 3
)

// Run runs the application with args (args[0] is the program name) and returns the exit code.
func Run(args []string, stdout, stderr io.Writer) int {
	app := App(stdout, stderr)
	if err := app.Run(args); err != nil {
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			if msg := err.Error(); msg != "" {
				fmt.Fprintln(stderr, "jobbus:", msg)
			}
			return ec.ExitCode()
		}
		fmt.Fprintln(stderr, "jobbus:", err)
		if isUsage(err) {
			return ExitUsage
		}
		return ExitError
	}
	return ExitOK
}

// App builds the application.
func App(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:                 "jobbus",
		Usage:                "a distributed job coordinator built on NATS",
		Version:              version.String(),
		Writer:               stdout,
		ErrWriter:            stderr,
		EnableBashCompletion: true,
		Flags:                globalFlags(),
		Commands: withGlobalFlags(append([]*cli.Command{
			serveCommand(),
			coordinatorCommand(),
			workerCommand(),
			bridgeCommand(),
			dashboardCommand(),
			benchCommand(),
			versionCommand(),
			completionCommand(),
		}, clientCommands()...)),
		ExitErrHandler: func(*cli.Context, error) {}, // Run prints errors and picks the exit code
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the jobbus version",
		Description: `Example:
   jobbus version`,
		Action: func(c *cli.Context) error {
			cli.ShowVersion(c) // the same line as --version
			return nil
		},
	}
}

// globalCategory heads the global flags in every command's help.
const globalCategory = "connection and logging (before or after the command name)"

// globalFlags are the flags every command takes, before or after its name. Each call
// builds new flags, as a flag keeps the state of the flag set it was applied to. Only
// the app's own read the environment, so a command's copy is set only when given
// after the command's name.
func globalFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "nats", Category: globalCategory, Usage: "NATS server URL: client commands and workers default to nats://127.0.0.1:4222; serve joins it instead of embedding one", EnvVars: env("nats")},
		&cli.StringFlag{Name: "nats-creds", Category: globalCategory, Usage: "NATS credentials file for --nats", EnvVars: env("nats-creds")},
		&cli.StringFlag{Name: "connect", Category: globalCategory, Usage: "client commands: talk to the TCP client port at host:port (e.g. 127.0.0.1:7071) instead of NATS", EnvVars: env("connect")},
		&cli.StringFlag{Name: "log-level", Category: globalCategory, Value: "info", Usage: "debug, info, warn or error", EnvVars: env("log-level")},
		&cli.StringFlag{Name: "log-format", Category: globalCategory, Value: "text", Usage: "text or json", EnvVars: env("log-format")},
	}
}

// withGlobalFlags lets each command take the global flags after its name too
// (urfave/cli v2 does not carry them down), except a name the command gives a
// meaning of its own, as worker does --connect.
func withGlobalFlags(cmds []*cli.Command) []*cli.Command {
	for _, cmd := range cmds {
	flags:
		for _, g := range globalFlags() {
			for _, f := range cmd.Flags {
				if f.Names()[0] == g.Names()[0] {
					continue flags
				}
			}
			g.(*cli.StringFlag).EnvVars = nil
			cmd.Flags = append(cmd.Flags, g)
		}
	}
	return cmds
}

// global reads a global flag: the value given after the command's name, else before
// it, else its environment variable, else its default.
func global(c *cli.Context, name string) string {
	for _, cc := range c.Lineage() {
		if cc.IsSet(name) {
			return cc.String(name)
		}
	}
	return c.String(name)
}

// env names the environment variable of a flag: JOBBUS_<FLAG_IN_CAPS>.
func env(flag string) []string {
	return []string{"JOBBUS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))}
}

// logger builds the slog logger of the global flags.
func logger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	levelName, format := global(c, "log-level"), global(c, "log-format")
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		return nil, usageError("--log-level must be debug, info, warn or error, got %q", levelName)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(c.App.ErrWriter, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(c.App.ErrWriter, opts)), nil
	}
	return nil, usageError("--log-format must be text or json, got %q", format)
}

type usage struct{ msg string }

func (u *usage) Error() string { return u.msg }

func usageError(format string, args ...any) error {
	return cli.Exit(&usage{fmt.Sprintf(format, args...)}, ExitUsage)
}

// isUsage recognises urfave/cli's own complaints about flags and arguments.
func isUsage(err error) bool {
	var u *usage
	if errors.As(err, &u) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{"flag provided but not defined", "invalid value", "Required flag", "No help topic", "flag needs an argument"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
