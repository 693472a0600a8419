// Package httpserver is the one HTTP listener of a jobbus process (serve, coordinator,
// bridge, dashboard): the dashboard at /, Prometheus metrics at /metrics, /healthz
// (the process is up) and /readyz (NATS connected, KV reachable, a coordinator leads and serves).
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/coordinator"
)

// DefaultListen is where `jobbus serve` listens: loopback, beside NATS (4222) and the
// TCP ports (7070, 7071).
const DefaultListen = "127.0.0.1:7072"

// ErrPortInUse: the listen address is taken by another process.
var ErrPortInUse = errors.New("port in use")

// Config is what a Server serves.
type Config struct {
	// Listen is the address (host:port; port 0 picks a free one).
	Listen string
	// NC is the process's NATS connection, which /readyz checks.
	NC *nats.Conn
	// Metrics serves /metrics; nil leaves it out.
	Metrics http.Handler
	// Dashboard serves / and everything else; nil leaves it out.
	Dashboard http.Handler
	// ReadyTimeout bounds a /readyz check (default 2s).
	ReadyTimeout time.Duration
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
}

// Server is a running HTTP listener.
type Server struct {
	srv     *http.Server
	ln      net.Listener
	log     *slog.Logger
	handler atomic.Pointer[http.Handler] // startingHandler until Mount
	done    chan struct{}
	once    sync.Once
}

// Start listens on cfg.Listen and serves cfg until Close.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.NC == nil {
		return nil, errors.New("httpserver: nil NATS connection")
	}
	s, err := Listen(ctx, cfg.Listen, cfg.Logger)
	if err != nil {
		return nil, err
	}
	s.Mount(cfg)
	return s, nil
}

// Listen listens on addr and, until Mount, answers /healthz and, to everything else,
// 503 "not ready: NATS not connected": a process that waits for its NATS (or its
// store) at start-up is up, and says why it is not ready yet.
func Listen(ctx context.Context, addr string, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		if isAddrInUse(err) {
			return nil, fmt.Errorf("http: listen %s: %w (pass --http-listen)", addr, ErrPortInUse)
		}
		return nil, fmt.Errorf("http: listen %s: %w", addr, err)
	}
	// Requests see a context that ends when Close starts, so long-lived event streams
	// end with the server instead of holding up its shutdown.
	base, stop := context.WithCancel(context.Background())
	s := &Server{ln: ln, log: log, done: make(chan struct{})}
	s.handler.Store(&startingHandler)
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*s.handler.Load()).ServeHTTP(w, r) }),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	s.srv.RegisterOnShutdown(stop)
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	log.Info("http listening", "addr", ln.Addr().String(), "dashboard", "http://"+ln.Addr().String()+"/")
	return s, nil
}

// Mount serves cfg from now on; its Listen, if empty, is the server's address.
func (s *Server) Mount(cfg Config) {
	if cfg.Listen == "" {
		cfg.Listen = s.ln.Addr().String()
	}
	h := Handler(cfg)
	s.handler.Store(&h)
}

// startingHandler is what a listener serves before Mount.
var startingHandler http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		healthz(w, r)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Error(w, "not ready: NATS not connected (starting up)", http.StatusServiceUnavailable)
})

func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

// Handler routes the health checks, metrics and dashboard of cfg.
func Handler(cfg Config) http.Handler {
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 2 * time.Second
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", healthz)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), cfg.ReadyTimeout)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		leader, err := Ready(ctx, cfg.NC)
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
		fmt.Fprintf(w, "ready: coordinator %s leads\n", leader)
	})
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics)
	}
	if cfg.Dashboard != nil {
		mux.Handle("/", cfg.Dashboard)
	}
	if isLoopback(cfg.Listen) {
		return loopbackHosts(mux)
	}
	return mux
}

// isLoopback reports whether addr (host:port) listens on loopback only.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopbackHosts refuses requests that name another host than a loopback one. A
// listener on loopback is reached from this machine only, so such a request comes
// from a page whose own name was made to resolve to 127.0.0.1 (DNS rebinding): to the
// browser that page and the dashboard are then one origin, and the host is all that
// tells them apart.
func loopbackHosts(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		ip := net.ParseIP(strings.Trim(host, "[]"))
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			http.Error(w, fmt.Sprintf("host %q refused: this listener serves loopback names only (localhost, 127.0.0.1)", r.Host), http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Ready checks that nc is connected, that JetStream KV answers (the job bucket exists),
// that a coordinator holds the leader lease, whose id it returns, and that its API
// answers (a leader is still recovering before it does) without an error: a leader
// whose lease may have run out by its own clock answers "coordinator is not serving".
func Ready(ctx context.Context, nc *nats.Conn) (leader string, err error) {
	if !nc.IsConnected() {
		return "", fmt.Errorf("NATS not connected (%s)", nc.Status())
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return "", fmt.Errorf("JetStream: %w", err)
	}
	if _, err := js.KeyValue(ctx, protocol.JobsBucket); err != nil {
		return "", fmt.Errorf("KV bucket %s not reachable: %w", protocol.JobsBucket, err)
	}
	if leader, err = coordinator.Leader(ctx, js); err != nil {
		return "", err
	}
	e, _ := protocol.EndpointFor(protocol.TypeListWorkers)
	reply, err := nc.RequestWithContext(ctx, e.Subject(), []byte(`{"type":"LIST_WORKERS"}`))
	if err != nil {
		return "", fmt.Errorf("coordinator %s leads but its API does not answer yet: %w", leader, err)
	}
	if text := reply.Header.Get(micro.ErrorHeader); text != "" {
		return "", fmt.Errorf("coordinator %s leads but its API answers: %s", leader, text)
	}
	return leader, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops listening and ends open requests (event streams included) within a
// second. It is idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			_ = s.srv.Close()
		}
		<-s.done
	})
	return nil
}

func isAddrInUse(err error) bool { return errors.Is(err, syscall.EADDRINUSE) }
