// Package cli is the jobbus command line: the urfave/cli/v2 application that maps flags
// (each also read from JOBBUS_<FLAG>) onto the configuration of the other packages.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/internal/brokenpipe"
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
		if helpTopicError(err) {
			fmt.Fprintln(stderr, "jobbus:", err)
			return ExitUsage
		}
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			if msg := err.Error(); msg != "" {
				fmt.Fprintln(stderr, "jobbus:", oneHint(msg))
			}
			return ec.ExitCode()
		}
		fmt.Fprintln(stderr, "jobbus:", oneHint(err.Error()))
		if isUsage(err) {
			return ExitUsage
		}
		return ExitError
	}
	return ExitOK
}

// hintRE matches the hint an error about a missing jobbus gives: "(is `jobbus serve`
// running?)", "(is `jobbus serve` or `jobbus bridge` running?)".
var hintRE = regexp.MustCompile("\\s*\\(is `jobbus [^()]*running\\?\\)")

// oneHint keeps the first such hint of msg: an error wrapped by several layers that
// each know how jobbus is started says so once.
func oneHint(msg string) string {
	first := true
	return hintRE.ReplaceAllStringFunc(msg, func(h string) string {
		if first {
			first = false
			return h
		}
		return ""
	})
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
		Action:               unknownCommand,
		OnUsageError:         onUsageError,
		Commands: withGlobalFlags(append([]*cli.Command{
			serveCommand(),
			coordinatorCommand(),
			workerCommand(),
			bridgeCommand(),
			muNodeCommand(),
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

// env names the environment variable of a flag: JOBBUS_<FLAG_IN_CAPS>.
func env(flag string) []string {
	return []string{"JOBBUS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))}
}

// logger builds the slog logger of the global flags. The commands that log are the
// services (serve, coordinator, bridge, worker, dashboard), which must finish their
// drain even when their log goes to a pipe whose reader has gone (`| tee`, then
// Ctrl-C): so from here on a broken pipe fails a write instead of killing the process.
func logger(c *cli.Context) (*slog.Logger, error) {
	brokenpipe.Survive()
	return loggerAt(c, "log-level", global(c, "log-level"))
}

// loggerAt builds a logger in the global --log-format at the level named by flag.
func loggerAt(c *cli.Context, flag, levelName string) (*slog.Logger, error) {
	var level slog.Level
	format := global(c, "log-format")
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		return nil, usageError("--%s must be debug, info, warn or error, got %q", flag, levelName)
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
