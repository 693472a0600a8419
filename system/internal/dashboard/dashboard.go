// Package dashboard is jobbus's web dashboard, served from the binary (embed; no
// build step, no CDN, so it works offline): a live job table with state and task-type
// filters and paging, a page per job, the workers and their load, throughput and
// latency charts over the last ten minutes, and cancel and resubmit buttons.
//
// Its data comes from NATS only, so it runs beside a coordinator or against a remote
// system alike: the jobs from a watch of the coordinator's KV bucket, the workers and
// every action through the Go client. The watch starts with the first request and
// stops after IdleStop without one, so a process whose dashboard nobody opens pays
// nothing for it; the charts show what was seen since it started.
//
// The page gets its updates as server-sent events, at most one per UpdateInterval
// whatever the job rate. Writes (cancel, resubmit) must carry the token the page was
// served with, in a header only a same-origin script can set, and come from the same
// origin, so another site open in the same browser cannot trigger them.
package dashboard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// Config configures a dashboard.
type Config struct {
	// NC is the connection to the jobbus system's NATS; the dashboard does not own it.
	NC *nats.Conn
	// UpdateInterval is the least time between two updates pushed to a page
	// (default 500ms).
	UpdateInterval time.Duration
	// WorkerPoll is how often the workers are listed while someone watches (default 1s).
	WorkerPoll time.Duration
	// IdleStop stops the KV watch this long after the last request (default 2 minutes).
	IdleStop time.Duration
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger

	watchOpened func(ctx context.Context) // a test's hook (export_test.go)
}

// Server serves the dashboard; it is an http.Handler. Close stops its watch.
type Server struct {
	cfg   Config
	log   *slog.Logger
	cl    *client.Client
	js    jetstream.JetStream
	token string
	page  []byte // index.html with the token

	muxOnce sync.Once
	handler http.Handler

	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	x        *index
	workers  []protocol.Worker
	queues   []protocol.QueueInfo    // queues.go
	depths   map[string][]depthPoint // queues.go
	running  bool                    // the watch is running
	lastUse  time.Time               // of the last request
	changed  chan struct{}
	watchErr string // why the jobs are not being watched, for the page

	// cached is the last summary, shared by the event streams for a moment so that
	// many pages cost no more than one.
	cached   summary
	cachedAt time.Time
	cachedX  *index

	limits []protocol.LimitInfo // the rate limits, polled with the workers
}

// New returns a dashboard for the jobbus system on cfg.NC.
func New(cfg Config) (*Server, error) {
	if cfg.NC == nil {
		return nil, errors.New("dashboard: nil NATS connection")
	}
	if cfg.UpdateInterval <= 0 {
		cfg.UpdateInterval = 500 * time.Millisecond
	}
	if cfg.WorkerPoll <= 0 {
		cfg.WorkerPoll = time.Second
	}
	if cfg.IdleStop <= 0 {
		cfg.IdleStop = 2 * time.Minute
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(cfg.NC)
	if err != nil {
		return nil, fmt.Errorf("dashboard: jetstream: %w", err)
	}
	var tok [24]byte
	_, _ = rand.Read(tok[:])
	page, err := renderIndex(hex.EncodeToString(tok[:]))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, log: log, cl: client.New(cfg.NC), js: js, token: hex.EncodeToString(tok[:]), page: page,
		ctx: ctx, cancel: cancel, x: newIndex(), changed: make(chan struct{}),
	}
	return s, nil
}

// Close stops the watch and waits for it. It is idempotent.
func (s *Server) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}

// touch records a request and starts the watch if it is not running.
func (s *Server) touch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastUse = time.Now()
	if s.running || s.ctx.Err() != nil {
		return
	}
	s.running = true
	s.x = newIndex()
	s.wg.Add(2)
	ctx, stop := context.WithCancel(s.ctx)
	go func() {
		defer s.wg.Done()
		defer stop()
		s.watchJobs(ctx)
	}()
	go func() {
		defer s.wg.Done()
		defer stop()
		s.pollWorkers(ctx, stop)
	}()
}

// notify wakes the event streams. Called with s.mu held.
func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// watchJobs follows the JOBS bucket into the index until ctx ends, opening it again
// after a failure (the bucket does not exist until a coordinator has run).
func (s *Server) watchJobs(ctx context.Context) {
	for ctx.Err() == nil {
		err := s.watchOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		if ctx.Err() == nil { // else a newer watch's error, or none, is the page's
			s.watchErr = err.Error()
			s.notify()
		}
		s.mu.Unlock()
		s.log.Debug("dashboard: job watch ended; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (s *Server) watchOnce(ctx context.Context) error {
	kv, err := s.js.KeyValue(ctx, protocol.JobsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("no job bucket %s yet: no coordinator has run on this NATS", protocol.JobsBucket)
	}
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", protocol.JobsBucket, err)
	}
	w, err := kv.Watch(ctx, "*") // records only (protocol.IsRecordKey)
	if err != nil {
		return fmt.Errorf("watch bucket %s: %w", protocol.JobsBucket, err)
	}
	defer func() { _ = w.Stop() }()
	if s.cfg.watchOpened != nil {
		s.cfg.watchOpened(ctx)
	}
	x := newIndex() // the watch replays every current record
	s.mu.Lock()
	if ctx.Err() != nil {
		// The idle stop ended this watch as it opened, and a request may have started
		// the next one since: the pages' index is that one's now.
		s.mu.Unlock()
		return nil
	}
	s.x = x
	s.watchErr = ""
	s.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the job watch ended")
			}
			s.apply(x, e)
		}
	}
}

// apply takes one watch entry into x, unless a newer watch replaced x; nil marks the
// end of the initial values.
func (s *Server) apply(x *index, e jetstream.KeyValueEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.x != x {
		return
	}
	switch {
	case e == nil:
		x.loaded = true
		x.version++
	case e.Operation() == jetstream.KeyValueDelete || e.Operation() == jetstream.KeyValuePurge:
		x.remove(e.Key())
	default:
		var rec storedJob
		if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.JobID == "" {
			return
		}
		rec.Payload = nil
		x.apply(&rec, time.Now(), x.loaded)
	}
	s.notify()
}

// pollWorkers lists the workers every WorkerPoll, and stops the watch (calling stop)
// once the dashboard has been idle for IdleStop.
func (s *Server) pollWorkers(ctx context.Context, stop func()) {
	t := time.NewTicker(s.cfg.WorkerPoll)
	defer t.Stop()
	for {
		ws, err := s.cl.Workers(ctx)
		s.pollQueues(ctx)
		ls, lerr := s.cl.Limits(ctx)
		s.mu.Lock()
		if err == nil {
			s.workers = ws
			s.notify()
		}
		if lerr == nil {
			s.limits = ls
		}
		idle := time.Since(s.lastUse) > s.cfg.IdleStop
		if idle {
			// Stopped under s.mu, with running: the watch sees its context ended (under
			// s.mu) before any request can start the next, so it never takes the pages'
			// index or error from that one.
			s.running = false
			stop()
		}
		s.mu.Unlock()
		if idle {
			s.log.Debug("dashboard idle; job watch stopped")
			return
		}
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.running = false
			s.mu.Unlock()
			return
		case <-t.C:
		}
	}
}
