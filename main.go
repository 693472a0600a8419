// Command jobbus is a distributed job coordinator built on NATS. See README.md.
package main

import (
	"os"

	"github.com/jobbus/jobbus/cli"
)

func main() {
	os.Exit(cli.Run(os.Args, os.Stdout, os.Stderr))
}
