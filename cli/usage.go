package cli

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
	"github.com/xrash/smetrics"
)

// Usage errors say in one line what was wrong and what is close, and exit ExitUsage:
// no help dump, which would push the line that matters off the screen.

// flagErrorRE matches the flag package's complaints, which name a flag with one dash.
var flagErrorRE = regexp.MustCompile(`^(flag provided but not defined|flag needs an argument|invalid value "[^"]*" for flag|invalid boolean value "[^"]*" for|bad flag syntax):? -{0,2}([^ :]*)(.*)$`)

// onUsageError is urfave/cli's OnUsageError of the app and of every command.
func onUsageError(c *cli.Context, err error, _ bool) error {
	return flagError(c, err)
}

// flagError turns the flag package's complaint about the command's arguments into a
// usage error naming the flag with its two dashes, with a suggestion where one is close.
func flagError(c *cli.Context, err error) error {
	where := commandPath(c)
	m := flagErrorRE.FindStringSubmatch(err.Error())
	if m == nil {
		return usageError("%s%v (see `%s --help`)", prefix(c), err, where)
	}
	name := m[2]
	dashed := "--" + name
	if len(name) == 1 {
		dashed = "-" + name
	}
	switch m[1] {
	case "flag provided but not defined":
		if isGlobal(name) && !commandTakes(c, name) {
			return usageError("%s does not apply to `%s` (see `%s --help`)", dashed, where, where)
		}
		msg := fmt.Sprintf("%sunknown flag %s", prefix(c), dashed)
		if s := closest(name, flagNames(c)); s != "" {
			msg += ", did you mean --" + s + "?"
		}
		return usageError("%s (see `%s --help`)", msg, where)
	case "flag needs an argument":
		return usageError("%s%s needs a value (see `%s --help`)", prefix(c), dashed, where)
	}
	if v := invalidValueRE.FindStringSubmatch(m[1]); v != nil {
		if _, ok := lookupFlag(c, name).(*cli.DurationFlag); ok { // the flag package says only "parse error"
			return usageError("%s%s", prefix(c), badDuration(dashed, v[1]))
		}
	}
	return usageError("%s%s %s%s", prefix(c), m[1], dashed, m[3])
}

// invalidValueRE takes the value out of flagErrorRE's "invalid value" complaint.
var invalidValueRE = regexp.MustCompile(`^invalid value "([^"]*)" for flag$`)

// bareNumberRE matches a number without a unit, which time.ParseDuration refuses
// (but for 0).
var bareNumberRE = regexp.MustCompile(`^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)$`)

// badDuration says what is wrong with value, refused as a duration for the flag
// dashed: a bare number lacks only its unit, and the text shows it with one.
func badDuration(dashed, value string) string {
	if bareNumberRE.MatchString(value) {
		return fmt.Sprintf("%s %s: a duration needs a unit, such as %ss or %sm", dashed, value, value, value)
	}
	return fmt.Sprintf("%s must be a duration such as 30s, 5m or 1h, got %q", dashed, value)
}

// lookupFlag is the flag called name that the command (or, at the top, the app)
// takes, or nil.
func lookupFlag(c *cli.Context, name string) cli.Flag {
	for _, f := range commandFlags(c) {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// commandPath is how the user called the command: "jobbus", "jobbus submit" or
// "jobbus queue ls".
func commandPath(c *cli.Context) string {
	if isApp(c) {
		return c.App.Name
	}
	return c.App.Name + " " + cmdName(c)
}

// cmdName is the command's name as typed after the program's: "submit", or for a
// subcommand its parent's name too, "queue ls" (`jobbus ls` is no command).
func cmdName(c *cli.Context) string {
	if h, ok := strings.CutPrefix(c.Command.HelpName, c.App.Name+" "); ok {
		return h
	}
	return c.Command.Name
}

// isApp reports whether c is the app's own context, before any command's name.
func isApp(c *cli.Context) bool {
	return c.Command == nil || c.Command.Name == "" || c.Command.Name == c.App.Name
}

// prefix is what a message about c's flags starts with: "submit: ", or nothing at the top.
func prefix(c *cli.Context) string {
	if isApp(c) {
		return ""
	}
	return cmdName(c) + ": "
}

// flagNames are the long names of the flags the command (or, at the top, the app) takes.
func flagNames(c *cli.Context) []string {
	var names []string
	for _, f := range commandFlags(c) {
		for _, n := range f.Names() {
			if len(n) > 1 {
				names = append(names, n)
			}
		}
	}
	return append(names, "help")
}

func commandTakes(c *cli.Context, name string) bool {
	for _, n := range flagNames(c) {
		if n == name {
			return true
		}
	}
	return false
}

// closest is the candidate nearest to given, or "" when none is close enough to be what
// the user meant: a typo, a prefix, or a word swapped for a neighbour's.
func closest(given string, candidates []string) string {
	best, score := "", 0.0
	sort.Strings(candidates)
	for _, c := range candidates {
		s := smetrics.JaroWinkler(given, c, 0.7, 4)
		if strings.HasPrefix(c, given) && len(given) >= 3 {
			s = max(s, 0.9)
		}
		if s > score {
			best, score = c, s
		}
	}
	if score < 0.8 {
		return ""
	}
	return best
}

// unknownCommand is the app's action: with no command it shows the help, with a word
// that is none it says so in one line.
func unknownCommand(c *cli.Context) error {
	if !c.Args().Present() {
		return cli.ShowAppHelp(c)
	}
	name := c.Args().First()
	msg := fmt.Sprintf("unknown command %q", name) + didYouMean(name, c.App.Name, c.App.VisibleCommands())
	return usageError("%s (see `jobbus --help` for the commands)", msg)
}

// didYouMean is ", did you mean `PATH NAME`?" for the command among cmds closest to
// the word typed, or "" if none is close; path is how their parent is called.
func didYouMean(typed, path string, cmds []*cli.Command) string {
	var names []string
	for _, cmd := range cmds {
		names = append(names, cmd.Names()...)
	}
	if s := closest(typed, names); s != "" {
		return fmt.Sprintf(", did you mean `%s %s`?", path, s)
	}
	return ""
}

// unknownSubcommand is the action of a command that groups others (queue, limit,
// schedule, workflow): with no subcommand it shows the help, with a word that is none
// it says so in one line, with what is close, as unknownCommand does.
func unknownSubcommand(c *cli.Context) error {
	if !c.Args().Present() {
		return cli.ShowSubcommandHelp(c)
	}
	name := c.Args().First()
	var subs []*cli.Command
	var all []string
	for _, sub := range c.Command.VisibleCommands() {
		if sub.Name != "help" {
			subs, all = append(subs, sub), append(all, sub.Name)
		}
	}
	msg := fmt.Sprintf("unknown %s command %q", cmdName(c), name) + didYouMean(name, commandPath(c), subs)
	return usageError("%s (%s; see `%s --help`)", msg, strings.Join(all, ", "), commandPath(c))
}

// helpTopicError recognises the help command's "No help topic" exit, which urfave/cli
// gives code 3, the code of an overload rejection: a typo is a usage error.
func helpTopicError(err error) bool {
	var ec cli.ExitCoder
	return errors.As(err, &ec) && strings.HasPrefix(err.Error(), "No help topic")
}

// commandFlags are the flags the command (or, at the top, the app) takes.
func commandFlags(c *cli.Context) []cli.Flag {
	if isApp(c) {
		return c.App.Flags
	}
	return c.Command.Flags
}
