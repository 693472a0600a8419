package embeddednats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Store faults, matched with errors.Is on what (*Server).StoreFault returns. They
// also match the system's error (syscall.ENOSPC, syscall.EROFS) where there is one.
var (
	// ErrStoreFull means the disk under the JetStream store has no room.
	ErrStoreFull = errors.New("the disk under the JetStream store is full")
	// ErrStoreReadOnly means the file system under the JetStream store is read-only.
	ErrStoreReadOnly = errors.New("the JetStream store is on a read-only file system")
	// ErrStoreFailed means JetStream could not write its store for another reason,
	// or is off after such a failure.
	ErrStoreFailed = errors.New("the JetStream store failed to write")
)

// Defaults of WithStoreGuard.
const (
	DefaultStoreCheck = 500 * time.Millisecond
	DefaultStoreProbe = 1 << 20
)

// WithStoreGuard sets how often the store guard checks JetStream for a failed write
// (every is 0: no guard), and how many bytes its probe writes next to the store before
// it restarts JetStream (0: DefaultStoreProbe).
//
// Why a guard: a stream whose file write fails (a full disk, a file system remounted
// read-only) is marked failed by nats-server and answers no write again, not even
// when the disk has room again, until JetStream restarts. The guard notices such a
// failure, says so (StoreFault), probes the disk, and when a probe write succeeds
// restarts JetStream in-process, which reopens every stream from its files, so the
// store takes writes again with no process restart.
func WithStoreGuard(every time.Duration, probeBytes int64) Option {
	return func(c *config) { c.storeCheck, c.storeProbe = every, probeBytes }
}

// StoreFault returns the failure JetStream's store is stuck on, or nil while it takes
// writes. Once the guard restarted JetStream on a store that takes writes again, it
// returns nil again.
func (s *Server) StoreFault() error {
	if s.guard == nil {
		return nil
	}
	return s.guard.fault()
}

// storeGuard watches a single, unclustered server's JetStream store; one goroutine
// (run) owns it, fault is read from anywhere.
type storeGuard struct {
	ns     *server.Server
	opts   server.Options // the options the server started with: JetStream's config
	global bool           // JetStream must be enabled on the global account too (auth.go)
	dir    string         // where the probe writes: the store's own file system
	every  time.Duration
	probe  int64
	log    *slog.Logger

	cur  atomic.Pointer[error]
	stop context.CancelFunc
	done sync.WaitGroup
}

func startStoreGuard(ns *server.Server, sopts *server.Options, cfg *config, global bool) *storeGuard {
	if cfg.storeCheck <= 0 || cfg.noJetStream || cfg.cluster != nil {
		// In a cluster the other servers hold the data and nats-server itself turns a
		// full server's JetStream off; a restart there is the operator's call.
		return nil
	}
	log := cfg.logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &storeGuard{ns: ns, opts: *sopts, global: global, dir: filepath.Join(sopts.StoreDir, server.JetStreamStoreDir),
		every: cfg.storeCheck, probe: cfg.storeProbe, log: log.With("component", "store-guard")}
	if g.probe <= 0 {
		g.probe = DefaultStoreProbe
	}
	ctx, stop := context.WithCancel(context.Background())
	g.stop = stop
	g.done.Add(1)
	go g.run(ctx)
	return g
}

func (g *storeGuard) close() {
	g.stop()
	g.done.Wait()
}

func (g *storeGuard) fault() error {
	if p := g.cur.Load(); p != nil {
		return *p
	}
	return nil
}

func (g *storeGuard) run(ctx context.Context) {
	defer g.done.Done()
	t := time.NewTicker(g.every)
	defer t.Stop()
	var lastSaid time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		failed := g.check()
		if failed == nil {
			if g.fault() != nil {
				g.log.Warn("JetStream's store takes writes again")
				g.cur.Store(nil)
			}
			continue
		}
		perr := g.probeWrite()
		err := classify(failed, perr)
		if g.fault() == nil {
			g.log.Error("JetStream's store failed: the stream takes no writes until JetStream restarts, which it does by itself "+
				"once a test write next to the store succeeds. Free space on the disk, or make it writable again",
				"err", err, "dir", g.dir)
			lastSaid = time.Now()
		}
		g.cur.Store(&err)
		if perr != nil {
			if time.Since(lastSaid) >= 30*time.Second {
				g.log.Error("JetStream's store still cannot be written; waiting for space or a writable file system", "err", perr, "dir", g.dir)
				lastSaid = time.Now()
			}
			continue
		}
		if rerr := g.restart(); rerr != nil {
			if time.Since(lastSaid) >= 30*time.Second {
				g.log.Error("the store's disk takes writes again, but JetStream did not restart; trying again", "err", rerr)
				lastSaid = time.Now()
			}
			continue
		}
		g.log.Warn("the store's disk takes writes again: restarted JetStream, which reopened its streams", "was", err)
	}
}

// check returns the store's failure as the server reports it, or nil: JetStream
// off, or a stream in error in the server's health check (HealthzErrorStream) that
// the server still holds (Jsz lists it). On a single server that is a stream whose
// store failed to write, in nats-server's words; the other stream error there, a
// stream that could not be recovered, is not held, and a restart would not mend it.
// What failed the write (a full disk, a read-only one) the server says only in
// words: the probe's own error tells it (classify).
func (g *storeGuard) check() error {
	if !g.ns.JetStreamEnabled() {
		return fmt.Errorf("%w: JetStream is off after a failure to write its store", ErrStoreFailed)
	}
	h := g.ns.Healthz(&server.HealthzOptions{Details: true})
	for _, e := range h.Errors {
		if e.Type == server.HealthzErrorStream && e.Stream != "" && g.holds(e.Account, e.Stream) {
			return errors.New(e.Error)
		}
	}
	return nil
}

// holds reports whether the server holds stream in account (Jsz lists it).
func (g *storeGuard) holds(account, stream string) bool {
	jsz, err := g.ns.Jsz(&server.JSzOptions{Account: account, Streams: true})
	if err != nil {
		return false
	}
	for _, a := range jsz.AccountDetails {
		for _, sd := range a.Streams {
			if sd.Name == stream {
				return true
			}
		}
	}
	return false
}

// classify words the store's failure: nats-server's words, and the kind and errno
// of what a write next to the store met (probe; nil when it succeeded).
func classify(failed, probe error) error {
	switch {
	case errors.Is(failed, ErrStoreFailed):
		return failed // JetStream off: its own words
	case errors.Is(probe, syscall.ENOSPC):
		return &storeError{msg: failed.Error(), kind: ErrStoreFull, errno: syscall.ENOSPC}
	case errors.Is(probe, syscall.EROFS):
		return &storeError{msg: failed.Error(), kind: ErrStoreReadOnly, errno: syscall.EROFS}
	}
	return &storeError{msg: failed.Error(), kind: ErrStoreFailed}
}

// storeError is a store fault: its kind and errno for errors.Is, nats-server's words
// for people.
type storeError struct {
	msg   string
	kind  error
	errno syscall.Errno
}

// Error is nats-server's words, which name the file and the system's error.
func (e *storeError) Error() string { return e.msg }

func (e *storeError) Unwrap() []error {
	if e.errno == 0 {
		return []error{e.kind}
	}
	return []error{e.kind, e.errno}
}

// storeUnwritable words err, met creating the store directory or its lock, when the
// disk is read-only or full (ErrStoreReadOnly, ErrStoreFull); nil for anything else.
func storeUnwritable(dir string, err error) error {
	switch {
	case errors.Is(err, syscall.EROFS):
		return &hintError{msg: fmt.Sprintf("embeddednats: the store directory %s is on a read-only file system (make it writable: mount -o remount,rw)", dir),
			sentinel: ErrStoreReadOnly, cause: err}
	case errors.Is(err, syscall.ENOSPC):
		return &hintError{msg: fmt.Sprintf("embeddednats: the disk of the store directory %s is full (free space on it)", dir),
			sentinel: ErrStoreFull, cause: err}
	}
	return nil
}

// probeWrite writes, syncs and removes a file of g.probe bytes in the store's
// directory: it succeeds once the disk has that much room and takes writes.
func (g *storeGuard) probeWrite() error {
	f, err := os.CreateTemp(g.dir, ".jobbus-probe-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = io.CopyN(f, zeros{}, g.probe)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// restart turns JetStream off, which closes every stream and forgets their write
// errors, and on again, which recovers the streams from their files: what a
// configuration reload that re-enables JetStream does.
func (g *storeGuard) restart() error {
	if g.ns.JetStreamIsClustered() { // from a configuration file: the cluster's call
		return errors.New("JetStream is clustered here: restart this server once its disk takes writes")
	}
	if err := g.ns.ShutdownJetStream(); err != nil {
		return fmt.Errorf("stop JetStream: %w", err)
	}
	o := g.opts
	err := g.ns.EnableJetStream(&server.JetStreamConfig{
		StoreDir: o.StoreDir, SyncInterval: o.SyncInterval, SyncAlways: o.SyncAlways, Strict: !o.NoJetStreamStrict,
		MaxMemory: o.JetStreamMaxMemory, MaxStore: o.JetStreamMaxStore, Domain: o.JetStreamDomain, CompressOK: true,
		UniqueTag: o.JetStreamUniqueTag,
	})
	if err != nil {
		return fmt.Errorf("start JetStream: %w", err)
	}
	if g.global {
		if err := g.ns.GlobalAccount().EnableJetStream(nil, nil); err != nil {
			return fmt.Errorf("enable JetStream for the global account: %w", err)
		}
	}
	return nil
}
