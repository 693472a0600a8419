package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
)

// TestOversizedTextsEndTheJob: a handler's result, or error, longer than a NATS message
// holds (2 MiB, the server's limit 1 MiB) still ends its job on its first attempt, with
// the text cut as the coordinator cuts every text longer than protocol.MaxTextBytes.
// Before, the worker offered a result NATS refused to publish again and again: the job
// stayed RUNNING until its execution deadline and then ran again.
func TestOversizedTextsEndTheJob(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	big := strings.Repeat("x", 2<<20)
	w, _ := sys.StartFunctionWorker(t, func(w *worker.Worker) error {
		return errors.Join(
			w.Handle("BIG_RESULT", func(context.Context, int, json.RawMessage) (string, error) { return big, nil }),
			w.Handle("BIG_ERROR", func(context.Context, int, json.RawMessage) (string, error) {
				return "", worker.Permanent(errors.New(big))
			}),
		)
	})
	cl := client.New(sys.NC)
	testkit.Eventually(t, 15*time.Second, "worker listed", func() bool { return jobbustest.WorkerListed(cl, w.ID()) })
	ok, err := cl.Submit(context.Background(), "BIG_RESULT", json.RawMessage(`{}`))
	must(t, err)
	failed, err := cl.Submit(context.Background(), "BIG_ERROR", json.RawMessage(`{}`))
	must(t, err)
	// Well within the coordinator's 10 s task timeout.
	testkit.Eventually(t, 5*time.Second, "both jobs ended", func() bool {
		return jobState(t, cl, ok).State == protocol.StateCompleted && jobState(t, cl, failed).State == protocol.StateFailed
	})
	for _, id := range []string{ok, failed} {
		j := jobState(t, cl, id)
		text := deref(j.Result)
		if j.State == protocol.StateFailed {
			text = deref(j.Error)
		}
		// A failure's text goes on to say which attempt failed.
		if j.Attempts != 1 || len(text) > protocol.MaxTextBytes+100 || !strings.Contains(text, "x... (truncated)") {
			t.Errorf("job %s: %s after %d attempts, text of %d bytes ending %q; want 1 attempt, about %d bytes, truncated",
				id, j.State, j.Attempts, len(text), text[max(0, len(text)-40):], protocol.MaxTextBytes)
		}
	}
}
