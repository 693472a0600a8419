package dashboard

import (
	"context"
	"net/http"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

// The schedules panel: every schedule with its next and last run, its state and its
// last error (GET /api/schedules, through the Go client), and pause and resume
// buttons (POST, behind guard like every write).

type schedulePage struct {
	Schedules []protocol.Schedule `json:"schedules"`
	NowMillis int64               `json:"nowMillis"`
}

func (s *Server) listSchedules(w http.ResponseWriter, r *http.Request) {
	s.touch()
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	scs, err := s.cl.Schedules(ctx)
	if err != nil {
		writeClientError(w, err)
		return
	}
	if scs == nil {
		scs = []protocol.Schedule{}
	}
	writeJSON(w, http.StatusOK, schedulePage{Schedules: scs, NowMillis: time.Now().UnixMilli()})
}

// changeSchedule pauses or resumes the schedule the path names.
func (s *Server) changeSchedule(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		do := s.cl.ResumeSchedule
		if pause {
			do = s.cl.PauseSchedule
		}
		sc, err := do(ctx, name)
		if err != nil {
			writeClientError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"schedule": sc})
	}
}
