package dashboard

import (
	"bytes"
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

//go:embed web
var webFS embed.FS

// TokenHeader carries the page's token on every write request.
const TokenHeader = "X-Jobbus-Token"

const tokenPlaceholder = "{{JOBBUS_TOKEN}}"

func renderIndex(token string) ([]byte, error) {
	page, err := webFS.ReadFile("web/index.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	return bytes.ReplaceAll(page, []byte(tokenPlaceholder), []byte(token)), nil
}

// ServeHTTP routes the dashboard's page, assets and API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux().ServeHTTP(w, r)
}

func (s *Server) mux() http.Handler {
	s.muxOnce.Do(func() {
		m := http.NewServeMux()
		static, _ := fs.Sub(webFS, "web")
		m.HandleFunc("GET /{$}", s.index)
		m.Handle("GET /static/", http.StripPrefix("/static/", cacheable(http.FileServerFS(static))))
		m.HandleFunc("GET /api/summary", s.summaryHandler)
		m.HandleFunc("GET /api/events", s.events)
		m.HandleFunc("GET /api/jobs", s.listJobs)
		m.HandleFunc("GET /api/jobs/{id}", s.jobDetail)
		m.HandleFunc("GET /api/jobs/{id}/logs", s.jobLogs) // logs.go
		m.HandleFunc("POST /api/jobs/{id}/cancel", s.guard(s.cancelJob))
		m.HandleFunc("POST /api/jobs/{id}/resubmit", s.guard(s.resubmitJob))
		m.HandleFunc("POST /api/queues/{name}/pause", s.guard(s.pauseQueue))
		m.HandleFunc("POST /api/queues/{name}/resume", s.guard(s.resumeQueue))
		m.HandleFunc("GET /api/workflows/{id}", s.workflowDetail) // workflow.go
		m.HandleFunc("GET /api/schedules", s.listSchedules)       // schedules.go
		m.HandleFunc("POST /api/schedules/{name}/pause", s.guard(s.changeSchedule(true)))
		m.HandleFunc("POST /api/schedules/{name}/resume", s.guard(s.changeSchedule(false)))
		s.handler = m
	})
	return s.handler
}

// securityHeaders keep the page from being framed (clickjacking its buttons) and its
// scripts to its own origin.
func securityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
}

func cacheable(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	s.touch()
	securityHeaders(w)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(s.page)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]string{"error": fmt.Sprintf(format, args...)})
}

// summary is what the page shows beside the job table; the event stream sends it.
type summary struct {
	Version  uint64                 `json:"version"`
	NowMilli int64                  `json:"nowMillis"`
	Loaded   bool                   `json:"loaded"`
	Problem  string                 `json:"problem,omitempty"`
	Counts   map[protocol.State]int `json:"counts"`
	Total    int                    `json:"total"`
	Types    []string               `json:"taskTypes"`
	Workers  []protocol.Worker      `json:"workers"`
	Limits   []protocol.LimitInfo   `json:"limits"`
	Chart    []point                `json:"chart"`
	Queues   []queueView            `json:"queues"`
}

func (s *Server) summary() summary {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	x := s.x
	if s.cachedX == x && s.cached.Version == x.version && now.Sub(s.cachedAt) < s.cfg.UpdateInterval/2 {
		return s.cached
	}
	sum := summary{Version: x.version, NowMilli: now.UnixMilli(), Loaded: x.loaded, Problem: s.watchErr,
		Counts: make(map[protocol.State]int, len(protocol.States)), Total: len(x.jobs),
		Workers: append([]protocol.Worker{}, s.workers...), Chart: x.chart(now), Queues: s.queueViews(), Limits: append([]protocol.LimitInfo{}, s.limits...)}
	for _, st := range protocol.States {
		sum.Counts[st] = x.counts[st]
	}
	for t := range x.types {
		sum.Types = append(sum.Types, t)
	}
	slices.Sort(sum.Types)
	s.cached, s.cachedAt, s.cachedX = sum, now, x
	return sum
}

func (s *Server) summaryHandler(w http.ResponseWriter, r *http.Request) {
	s.touch()
	s.waitLoaded(r.Context())
	writeJSON(w, http.StatusOK, s.summary())
}

// events streams the summary as server-sent events: one at once, then one after each
// change, but never more than one per UpdateInterval, and one every few seconds
// anyway so that the charts move on.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, "streaming unsupported")
		return
	}
	s.touch()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	const heartbeat = 5 * time.Second
	var last uint64
	sent := time.Time{}
	for {
		sum := s.summary()
		if sum.Version != last || time.Since(sent) >= heartbeat {
			data, _ := json.Marshal(sum)
			if _, err := fmt.Fprintf(w, "event: summary\ndata: %s\n\n", data); err != nil {
				return
			}
			fl.Flush()
			last, sent = sum.Version, time.Now()
		}
		s.mu.Lock()
		changed := s.changed
		s.mu.Unlock()
		// Rate limit first, then wait for a change (or the heartbeat).
		select {
		case <-r.Context().Done():
			return
		case <-s.ctx.Done():
			return
		case <-time.After(s.cfg.UpdateInterval):
		}
		s.touch()
		select {
		case <-r.Context().Done():
			return
		case <-s.ctx.Done():
			return
		case <-changed:
		case <-time.After(heartbeat):
		}
	}
}

// loadWait bounds how long a request waits for the watch to read the stored jobs.
const loadWait = 5 * time.Second

// waitLoaded waits until the watch has read the stored jobs, so that the first answer
// after it started is not an empty table, unless the watch is failing (the answer
// says why), ctx ends or loadWait passes: then the answer says "loaded": false.
func (s *Server) waitLoaded(ctx context.Context) {
	timeout := time.NewTimer(loadWait)
	defer timeout.Stop()
	for {
		s.mu.Lock()
		done, changed := s.x.loaded || s.watchErr != "", s.changed
		s.mu.Unlock()
		if done {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		case <-s.ctx.Done():
			return
		case <-timeout.C:
			return
		}
	}
}

// jobPage is one page of the job table.
type jobPage struct {
	Jobs       []row  `json:"jobs"`
	NextCursor string `json:"nextCursor,omitempty"`
	Loaded     bool   `json:"loaded"`
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) {
	s.touch()
	q := r.URL.Query()
	var state protocol.State
	if v := q.Get("state"); v != "" {
		st, err := protocol.ParseState(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "state: %v", err)
			return
		}
		state = st
	}
	limit := 50
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			writeError(w, http.StatusBadRequest, "limit must be 1..500, got %q", v)
			return
		}
		limit = n
	}
	var before uint64
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid cursor %q", v)
			return
		}
		before = n
	}
	s.waitLoaded(r.Context())
	s.mu.Lock()
	rows, next := s.x.page(state, q.Get("type"), before, limit)
	loaded := s.x.loaded
	s.mu.Unlock()
	out := jobPage{Jobs: rows, Loaded: loaded}
	if out.Jobs == nil {
		out.Jobs = []row{}
	}
	if next != 0 {
		out.NextCursor = strconv.FormatUint(next, 10)
	}
	writeJSON(w, http.StatusOK, out)
}

// detail is a job's page: the stored record (payload included) and the changes the
// dashboard saw.
type detail struct {
	storedJob
	History     []change `json:"history"`
	Fingerprint string   `json:"-"` // hides the record's: internal to idempotency
}

// recordOrAnswer reads job id's record; when there is none to read it answers the
// request (404 for a job unknown, expired or never one, 502 when the store fails) and
// reports false.
func (s *Server) recordOrAnswer(ctx context.Context, w http.ResponseWriter, id string) (*storedJob, bool) {
	rec, err := s.record(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrInvalidKey), errors.Is(err, jetstream.ErrKeyDeleted):
		writeError(w, http.StatusNotFound, "Unknown job: %s", id)
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadGateway, "read job %s: %v", id, err)
		return nil, false
	}
	return rec, true
}

func (s *Server) record(ctx context.Context, id string) (*storedJob, error) {
	if !protocol.IsRecordKey(id) {
		// The bucket's other keys (settings, bindings, the term) are no jobs.
		return nil, jetstream.ErrKeyNotFound
	}
	kv, err := s.js.KeyValue(ctx, protocol.JobsBucket)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	var rec storedJob
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, fmt.Errorf("job %s: unreadable record: %w", id, err)
	}
	return &rec, nil
}

func (s *Server) jobDetail(w http.ResponseWriter, r *http.Request) {
	s.touch()
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	rec, ok := s.recordOrAnswer(ctx, w, id)
	if !ok {
		return
	}
	if rec.State != protocol.StateRunning {
		rec.WorkerID = ""
	}
	d := detail{storedJob: *rec}
	s.mu.Lock()
	if row := s.x.jobs[id]; row != nil {
		d.History = append([]change{}, row.history...)
	}
	s.mu.Unlock()
	if d.History == nil {
		d.History = []change{}
	}
	writeJSON(w, http.StatusOK, d)
}

// guard lets a write through only from the dashboard's own page: the token it was
// served with, in a header (a cross-site form cannot set one, and a cross-site script
// cannot without a CORS preflight, which is never granted), and, where the browser
// says, the same origin.
func (s *Server) guard(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(TokenHeader)), []byte(s.token)) != 1 {
			writeError(w, http.StatusForbidden, "missing or wrong %s: reload the dashboard", TokenHeader)
			return
		}
		if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
			writeError(w, http.StatusForbidden, "cross-site request refused")
			return
		}
		if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r) {
			writeError(w, http.StatusForbidden, "cross-origin request refused")
			return
		}
		s.touch()
		h(w, r)
	}
}

func sameOrigin(origin string, r *http.Request) bool {
	host, ok := strings.CutPrefix(origin, "http://")
	if !ok {
		host, ok = strings.CutPrefix(origin, "https://")
	}
	return ok && host == r.Host
}

func (s *Server) cancelJob(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	cancelled, job, err := s.cl.Cancel(ctx, id)
	if err != nil {
		writeClientError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"cancelled": cancelled, "job": job})
}

// resubmitJob submits a new job with the type, payload, priority and attempts of one
// stored (without its idempotency key: it is a new submission).
func (s *Server) resubmitJob(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	rec, ok := s.recordOrAnswer(ctx, w, id)
	if !ok {
		return
	}
	opts := []client.SubmitOption{client.MaxAttempts(rec.MaxAttempts)}
	if rec.Priority != "" {
		opts = append(opts, client.Priority(rec.Priority))
	}
	newID, err := s.cl.Submit(ctx, rec.TaskType, json.RawMessage(rec.Payload), opts...)
	if err != nil {
		writeClientError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"jobId": newID, "resubmittedFrom": id})
}

func writeClientError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, client.ErrRejected):
		writeError(w, http.StatusTooManyRequests, "%v", err)
	case errors.Is(err, client.ErrNoCoordinator):
		writeError(w, http.StatusServiceUnavailable, "%v", err)
	case errors.Is(err, client.ErrServer):
		status := http.StatusBadRequest
		if strings.HasPrefix(err.Error(), "Unknown job") || strings.Contains(err.Error(), protocol.UnknownSchedulePrefix) || client.IsUnknownQueue(err) {
			status = http.StatusNotFound
		}
		writeError(w, status, "%v", err)
	default:
		writeError(w, http.StatusBadGateway, "%v", err)
	}
}
