package cli

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/jobbus/jobbus/embeddednats"
)

// listenAddr is an address a command is about to listen on, and the flag that moves it.
type listenAddr struct {
	addr string // host:port
	what string // what listens there
	fix  string // the flag that moves it, as the user would type it
}

// servePorts are the addresses serve (and bridge: embedded false) listens on, from
// their flags. A port of 0 (any free one) or -1 (off) is none.
func servePorts(c *cli.Context, embedded bool) []listenAddr {
	var out []listenAddr
	add := func(addr, what, fix string) {
		if _, port, err := net.SplitHostPort(addr); err == nil {
			if n, err := strconv.Atoi(port); err == nil && n > 0 {
				out = append(out, listenAddr{addr, what, fix})
			}
		}
	}
	if embedded {
		if c.String("nats-config") == "" { // the file's port wins
			add(c.String("nats-listen"), "NATS", "--nats-listen 127.0.0.1:PORT")
		}
		add(c.String("nats-http-listen"), "NATS monitoring", "--nats-http-listen 127.0.0.1:PORT")
		if len(c.StringSlice("routes")) > 0 {
			listen := c.String("cluster-listen")
			if listen == "" {
				listen = "127.0.0.1:6222"
			}
			add(listen, "NATS cluster routes", "--cluster-listen HOST:PORT")
		}
		add(c.String("leafnode-listen"), "NATS leaf nodes", "--leafnode-listen HOST:PORT")
	}
	host := c.String("listen-host")
	for _, p := range []struct{ flag, what string }{{"worker-port", "TCP worker port"}, {"client-port", "TCP client port"}} {
		add(net.JoinHostPort(host, strconv.Itoa(c.Int(p.flag))), p.what, "--"+p.flag+" PORT (0: any free port, -1: off)")
	}
	if hl := c.String("http-listen"); hl != "" && hl != "-" {
		add(hl, "dashboard and metrics", "--http-listen 127.0.0.1:PORT (-: off)")
	}
	return out
}

// checkFree reports at once every listen address in use among addrs and, when
// dataDir is not "", whether another server holds that store: a second serve on one
// machine learns everything it must move in one go, not one start at a time. Another
// process may still take a port between this check and the listen, which then says so.
func checkFree(addrs []listenAddr, dataDir string) error {
	var busy []string
	ports := 0
	given := map[string]string{} // address -> the flag that gave it first
	for _, a := range addrs {
		flag, _, _ := strings.Cut(a.fix, " ")
		if first, dup := given[a.addr]; dup {
			busy = append(busy, fmt.Sprintf("  %-21s %-22s given to %s too: move one of them", a.addr, a.what, first))
			ports++
			continue
		}
		given[a.addr] = flag
		l, err := net.Listen("tcp", a.addr)
		if err == nil {
			_ = l.Close()
			continue
		}
		if isAddrInUse(err) {
			busy = append(busy, fmt.Sprintf("  %-21s %-22s move it with %s", a.addr, a.what, a.fix))
			ports++
		}
	}
	locked := dataDir != "" && embeddednats.StoreLocked(dataDir)
	if locked {
		busy = append(busy, fmt.Sprintf("  %-21s %-22s use another with --data-dir DIR", dataDir, "store (locked)"))
	}
	if len(busy) == 0 {
		return nil
	}
	var what []string
	switch {
	case ports == 1:
		what = append(what, "1 port is in use")
	case ports > 1:
		what = append(what, fmt.Sprintf("%d ports are in use", ports))
	}
	if locked {
		what = append(what, "the store is locked by another server")
	}
	return cli.Exit(fmt.Sprintf("cannot start: %s (is another jobbus running on this machine?)\n%s",
		strings.Join(what, " and "), strings.Join(busy, "\n")), ExitError)
}

// checkServeFree is checkFree for serve's flags: the embedded server's addresses and
// store too, unless serve joins a NATS server (--nats, --context) or a nats-server
// configuration file sets them.
func checkServeFree(c *cli.Context) error {
	target, err := natsTarget(c, true)
	if err != nil {
		return err
	}
	embedded := target.url == ""
	dataDir := ""
	if embedded && c.String("nats-config") == "" {
		dataDir = c.String("data-dir")
	}
	return checkFree(servePorts(c, embedded), dataDir)
}

// isAddrInUse recognises a listen refused because the address is taken (Windows'
// WSAEADDRINUSE is not syscall.EADDRINUSE; its text is stable).
func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "Only one usage of each socket address")
}
