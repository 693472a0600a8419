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
)

// Version is the jobbus version, set at build time with -ldflags "-X".
var Version = "0.1.0-dev"

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
		Version:              Version,
		Writer:               stdout,
		ErrWriter:            stderr,
		EnableBashCompletion: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "nats", Usage: "NATS server URL: client commands and workers default to nats://127.0.0.1:4222; serve joins it instead of embedding one", EnvVars: env("nats")},
			&cli.StringFlag{Name: "nats-creds", Usage: "NATS credentials file for --nats", EnvVars: env("nats-creds")},
			&cli.StringFlag{Name: "connect", Usage: "client commands: talk to the TCP client port at host:port (e.g. 127.0.0.1:7071) instead of NATS", EnvVars: env("connect")},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", EnvVars: env("log-level")},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json", EnvVars: env("log-format")},
		},
		Commands: append([]*cli.Command{
			serveCommand(),
			coordinatorCommand(),
			workerCommand(),
			bridgeCommand(),
			benchCommand(),
			versionCommand(),
			completionCommand(),
		}, clientCommands()...),
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
			_, err := fmt.Fprintf(c.App.Writer, "jobbus %s\n", Version)
			return err
		},
	}
}

// env names the environment variable of a flag: JOBBUS_<FLAG_IN_CAPS>.
func env(flag string) []string {
	return []string{"JOBBUS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))}
}

// logger builds the slog logger of the global flags.
func logger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, usageError("--log-level must be debug, info, warn or error, got %q", c.String("log-level"))
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(c.App.ErrWriter, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(c.App.ErrWriter, opts)), nil
	}
	return nil, usageError("--log-format must be text or json, got %q", c.String("log-format"))
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
