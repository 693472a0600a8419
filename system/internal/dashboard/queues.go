package dashboard

import (
	"context"
	"net/http"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// The queues page: each named queue as the coordinator lists it (polled with the
// workers), its depth over the last ten minutes, and pause and resume buttons.

const (
	depthStep   = 5 * time.Second  // one depth point per queue per step
	depthWindow = 10 * time.Minute // the chart's span
)

// depthPoint is a queue's depth at a moment.
type depthPoint struct {
	AtMillis int64 `json:"atMillis"`
	Depth    int   `json:"depth"`
}

// queueView is a queue on the page: as listed, with its recent depth, oldest first.
type queueView struct {
	protocol.QueueInfo
	History []depthPoint `json:"history"`
}

// pollQueues lists the queues and notes each one's depth, at most once per depthStep.
func (s *Server) pollQueues(ctx context.Context) {
	qs, err := s.cl.Queues(ctx)
	if err != nil {
		return // a coordinator without queues, or none: the page shows none
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queues = qs
	if s.depths == nil {
		s.depths = make(map[string][]depthPoint)
	}
	seen := make(map[string]bool, len(qs))
	for _, q := range qs {
		seen[q.Name] = true
		h := s.depths[q.Name]
		if n := len(h); n > 0 && now.Sub(time.UnixMilli(h[n-1].AtMillis)) < depthStep {
			h[n-1].Depth = max(h[n-1].Depth, q.Queued) // the step's peak
			continue
		}
		cut := 0
		for cut < len(h) && now.Sub(time.UnixMilli(h[cut].AtMillis)) > depthWindow {
			cut++
		}
		s.depths[q.Name] = append(h[cut:], depthPoint{AtMillis: now.UnixMilli(), Depth: q.Queued})
	}
	for name := range s.depths {
		if !seen[name] {
			delete(s.depths, name)
		}
	}
}

// queueViews is the queues with their depth. Called with s.mu held.
func (s *Server) queueViews() []queueView {
	out := make([]queueView, 0, len(s.queues))
	for _, q := range s.queues {
		out = append(out, queueView{QueueInfo: q, History: append([]depthPoint{}, s.depths[q.Name]...)})
	}
	return out
}

func (s *Server) pauseQueue(w http.ResponseWriter, r *http.Request) {
	s.changeQueue(w, r, true)
}

func (s *Server) resumeQueue(w http.ResponseWriter, r *http.Request) {
	s.changeQueue(w, r, false)
}

func (s *Server) changeQueue(w http.ResponseWriter, r *http.Request, pause bool) {
	name := r.PathValue("name")
	if err := protocol.CheckQueueName(name); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	change := s.cl.ResumeQueue
	if pause {
		change = s.cl.PauseQueue
	}
	q, err := change(ctx, name)
	if err != nil {
		writeClientError(w, err)
		return
	}
	s.pollQueues(ctx) // the page's next summary shows it
	s.mu.Lock()
	s.notify()
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, q)
}
