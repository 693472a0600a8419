package cli

import (
	"flag"

	"github.com/urfave/cli/v2"
)

// urfave/cli/v2 keeps its --help and --version flags in package variables (HelpFlag,
// VersionFlag) and applies the same flag to every command it runs; Apply records the
// flag's default on the flag itself, so two applications running at once in one
// process (the tests run many) write to it together, which the race detector reports.
// Each Apply here works on a copy.
func init() {
	for _, f := range []*cli.Flag{&cli.HelpFlag, &cli.VersionFlag} {
		if b, ok := (*f).(*cli.BoolFlag); ok {
			*f = &sharedBoolFlag{*b}
		}
	}
}

// sharedBoolFlag is a BoolFlag that applies a copy of itself.
type sharedBoolFlag struct{ cli.BoolFlag }

func (f *sharedBoolFlag) Apply(set *flag.FlagSet) error {
	c := f.BoolFlag
	return c.Apply(set)
}
