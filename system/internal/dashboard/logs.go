package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
)

// logPage is a piece of a job's log for its page: the records of the chunks stored
// after sequence `after`, and the sequence to ask after next. Final says, for each
// attempt with a chunk among them, whether its last one here is the attempt's last
// (protocol.HeaderLogFinal, often empty, so its records do not tell): a job cancelled,
// or whose deadline passed, ends before its handler returns, and the page polls a
// finished job's log until each attempt it read has its last chunk, as `jobbus logs
// --follow` does.
type logPage struct {
	Records []logLine    `json:"records"`
	Next    uint64       `json:"next"`
	Final   map[int]bool `json:"final"`
}

// logLine is one record of a job's log: the worker's JSON, its attempt, and whether
// it is a marker that older chunks of the attempt were dropped.
type logLine struct {
	Attempt int             `json:"attempt"`
	Chunk   int             `json:"chunk"`
	Record  json.RawMessage `json:"record"`
}

// logChunksPerPage bounds what one request reads: the whole of a job's log.
const logChunksPerPage = protocol.LogChunksPerJob

// jobLogs serves GET /api/jobs/{id}/logs?after=SEQ: the job's log chunks stored after
// stream sequence SEQ (0: from the oldest kept), read with direct gets by subject, so
// the page polls it while the job runs (and after, until each attempt's last chunk)
// without a consumer on the server. The job is read first, as `jobbus logs` asks for
// it: a log outlives its job's record by the logs stream's margin, and an expired job
// is unknown, its log with it.
func (s *Server) jobLogs(w http.ResponseWriter, r *http.Request) {
	s.touch()
	id := r.PathValue("id")
	after, err := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
	if r.URL.Query().Get("after") != "" && err != nil {
		writeError(w, http.StatusBadRequest, "after must be a stream sequence, got %q", r.URL.Query().Get("after"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if _, ok := s.recordOrAnswer(ctx, w, id); !ok {
		return
	}
	page := logPage{Records: []logLine{}, Next: after, Final: map[int]bool{}}
	stream, err := s.js.Stream(ctx, protocol.LogsStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		writeJSON(w, http.StatusOK, page)
		return
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, "read job %s's log: %v", id, err)
		return
	}
	subject := protocol.LogSubject(id)
	for range logChunksPerPage {
		m, err := stream.GetMsg(ctx, page.Next+1, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			writeError(w, http.StatusBadGateway, "read job %s's log: %v", id, err)
			return
		}
		page.Next = m.Sequence
		attempt, _ := strconv.Atoi(m.Header.Get(protocol.HeaderLogAttempt))
		chunk, _ := strconv.Atoi(m.Header.Get(protocol.HeaderLogChunk))
		page.Final[attempt] = m.Header.Get(protocol.HeaderLogFinal) != ""
		for line := range bytes.SplitSeq(m.Data, []byte{'\n'}) {
			if len(bytes.TrimSpace(line)) == 0 || !json.Valid(line) {
				continue
			}
			page.Records = append(page.Records, logLine{Attempt: attempt, Chunk: chunk, Record: json.RawMessage(line)})
		}
	}
	writeJSON(w, http.StatusOK, page)
}
