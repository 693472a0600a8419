// Package brokenpipe keeps a jobbus service alive when its standard output or error is
// a pipe whose reader has gone: `jobbus serve 2>&1 | tee serve.log`, then Ctrl-C, ends
// tee at once, and serve's first shutdown log line then writes to a closed pipe.
//
// Go's runtime kills a program with SIGPIPE for a write to a broken pipe on file
// descriptor 1 or 2, unless the program handles SIGPIPE (os/signal: "If the program
// has called Notify to receive SIGPIPE signals, the file descriptor number does not
// matter. The SIGPIPE signal will be delivered to the Notify channel, and the write
// will fail with an EPIPE error"). A service must finish its drain whatever happens to
// its log: a lost log line costs nothing, a drain cut short costs running jobs an
// attempt and the store a clean close. log/slog drops a handler's write error, so the
// log goes on failing quietly.
//
// Only services call Survive. A client command (`jobbus jobs --watch | head`) should
// still end when its reader does, as command-line tools do.
package brokenpipe

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

var once sync.Once

// Survive makes writes to a broken pipe fail with EPIPE instead of killing the process,
// for the rest of its life. It is idempotent and starts no goroutine: the signal is
// delivered to a channel nobody reads, which os/signal never blocks on. Notify, rather
// than signal.Ignore, so that processes the service starts do not inherit SIGPIPE
// ignored.
func Survive() {
	once.Do(func() { signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE) })
}
