package dashboard

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// workflowDetail answers GET /api/workflows/{id}: the workflow's (or batch's) state
// and each step's, with the steps it waits for, as the coordinator tells them
// (jobbus.api.workflow.status). The page draws it as a graph.
func (s *Server) workflowDetail(w http.ResponseWriter, r *http.Request) {
	s.touch()
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	st, err := s.cl.WorkflowStatus(ctx, id)
	var se *client.ServerError
	switch {
	case errors.As(err, &se) && strings.HasPrefix(se.Message, "Unknown workflow"):
		writeError(w, http.StatusNotFound, "%s", se.Message)
		return
	case err != nil:
		writeError(w, http.StatusBadGateway, "workflow %s: %v", id, err)
		return
	}
	type plain protocol.WorkflowStatus // without the message's "type"
	if st.Steps == nil {
		st.Steps = []protocol.StepStatus{}
	}
	writeJSON(w, http.StatusOK, plain(st))
}
