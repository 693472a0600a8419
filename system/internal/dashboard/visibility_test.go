package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/system/internal/dashboard"
	"github.com/jobbus/jobbus/worker"
)

// chattyArgs is the payload of CHATTY: it reports progress and logs a line every
// 100 ms, Steps times, then waits until released.
type chattyArgs struct {
	Steps int `json:"steps"`
	// CleanupMillis: cancelled, it logs "cleaning up", takes this long,
	// and logs "cleaned up" before it returns.
	CleanupMillis int `json:"cleanupMillis,omitempty"`
}

// startChatty starts s's worker serving CHATTY, whose jobs end once release is called.
func startChatty(t *testing.T, s *system) (release func()) {
	t.Helper()
	gate := make(chan struct{})
	release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	w, _ := s.StartFunctionWorker(t, func(w *worker.Worker) error {
		return worker.HandleJSON(w, "CHATTY", func(ctx context.Context, _ int, a chattyArgs) (string, error) {
			log := worker.Logger(ctx)
			defer func() {
				if ctx.Err() != nil && a.CleanupMillis > 0 {
					log.Warn("cleaning up")
					time.Sleep(time.Duration(a.CleanupMillis) * time.Millisecond) // the handler's work, not a wait for the test
					log.Warn("cleaned up")
				}
			}()
			for i := 1; i <= a.Steps; i++ {
				worker.Progress(ctx, float64(i)/float64(a.Steps+1), fmt.Sprintf("step %d of %d", i, a.Steps+1))
				log.Info("working", "step", i, "rows", i*1000)
				select {
				case <-time.After(100 * time.Millisecond):
				case <-ctx.Done():
					return "", ctx.Err()
				}
			}
			select {
			case <-gate:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			worker.Progress(ctx, 1, "done")
			log.Warn("finished", "steps", a.Steps)
			return "ok", nil
		})
	})
	testkit.Eventually(t, waitFor, "worker listed", func() bool { return jobbustest.WorkerListed(s.cl, w.ID()) })
	return release
}

// TestJobLogsAPI: GET /api/jobs/{id}/logs hands the job's log records after a stream
// sequence, and the next sequence to ask after.
func TestJobLogsAPI(t *testing.T) {
	t.Parallel()
	s := start(t, false, nil)
	release := startChatty(t, s)
	id := s.submit(t, "CHATTY", chattyArgs{Steps: 3})
	var page struct {
		Records []struct {
			Attempt int `json:"attempt"`
			Record  struct {
				Msg  string `json:"msg"`
				Step int    `json:"step"`
			} `json:"record"`
		} `json:"records"`
		Next uint64 `json:"next"`
	}
	testkit.Eventually(t, waitFor, "three records", func() bool {
		return getJSON(t, s.url+"/api/jobs/"+id+"/logs", &page) == http.StatusOK && len(page.Records) == 3
	})
	for i, r := range page.Records {
		if r.Attempt != 1 || r.Record.Msg != "working" || r.Record.Step != i+1 {
			t.Fatalf("record %d: %+v", i, r)
		}
	}
	release()
	if j, err := s.cl.Wait(context.Background(), id); err != nil || j.State != protocol.StateCompleted {
		t.Fatalf("job: %+v %v", j, err)
	}
	after := page.Next
	if code := getJSON(t, fmt.Sprintf("%s/api/jobs/%s/logs?after=%d", s.url, id, after), &page); code != http.StatusOK {
		t.Fatalf("GET logs after %d: %d", after, code)
	}
	if len(page.Records) != 1 || page.Records[0].Record.Msg != "finished" || page.Next <= after {
		t.Fatalf("records after %d: %+v (next %d)", after, page.Records, page.Next)
	}
	if code := getJSON(t, s.url+"/api/jobs/no.such/logs", &page); code != http.StatusNotFound {
		t.Fatalf("logs of a bad id: %d, want 404", code)
	}
}

// TestJobLogsAPIOfAnExpiredJob: once a job has expired, its log is not served (it
// outlives the record by the logs stream's margin): 404, as the job page and `jobbus
// logs` answer Unknown job.
func TestJobLogsAPIOfAnExpiredJob(t *testing.T) {
	t.Parallel()
	s := start(t, false, nil, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) { c.Retention = time.Second }))
	release := startChatty(t, s)
	release()
	id := s.submit(t, "CHATTY", chattyArgs{Steps: 1})
	if j, err := s.cl.Wait(context.Background(), id); err != nil || j.State != protocol.StateCompleted {
		t.Fatalf("job: %+v %v", j, err)
	}
	var page struct {
		Records []json.RawMessage `json:"records"`
	}
	if code := getJSON(t, s.url+"/api/jobs/"+id+"/logs", &page); code != http.StatusOK || len(page.Records) != 2 {
		t.Fatalf("logs of the finished job: %d %s", code, page.Records)
	}
	var e struct {
		Error string `json:"error"`
	}
	testkit.Eventually(t, waitFor, "the job expired", func() bool {
		_, err := s.cl.Status(context.Background(), id)
		return err != nil && strings.Contains(err.Error(), "Unknown job") &&
			getJSON(t, s.url+"/api/jobs/"+id, &e) == http.StatusNotFound
	})
	var logs map[string]any
	if code := getJSON(t, s.url+"/api/jobs/"+id+"/logs", &logs); code != http.StatusNotFound || !strings.Contains(fmt.Sprint(logs["error"]), "Unknown job") {
		t.Fatalf("logs of the expired job: %d %v, want 404 Unknown job", code, logs)
	}
	req, _ := http.NewRequest(http.MethodPost, s.url+"/api/jobs/"+id+"/resubmit", strings.NewReader("{}"))
	req.Header.Set(dashboard.TokenHeader, s.token(t))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("resubmit of the expired job: %d, want 404 as its page", resp.StatusCode)
	}
}

// TestJobPageShowsProgressAndLiveLog: the job page of a running job shows its
// handler's progress as a bar and its log as it is written, without a reload, and the
// last of both once it completed.
func TestJobPageShowsProgressAndLiveLog(t *testing.T) {
	browser := startBrowser(t)
	shots := screenshotDir(t)
	s := start(t, false, nil)
	release := startChatty(t, s)
	id := s.submit(t, "CHATTY", chattyArgs{Steps: 6})

	tb := openTab(t, browser, s.url, shots)
	tb.open("#/job/" + id)
	tb.eval(`window.__notReloaded = "yes"`)
	tb.until("the job page to show RUNNING", `document.querySelector('[data-field="state"] .RUNNING') !== null`)
	tb.until("a progress bar", `!document.getElementById("j-progress").hidden && parseFloat(document.getElementById("j-progress-fill").style.width) > 0`)
	tb.until("the log growing live", `document.getElementById("j-log").textContent.includes("working") && document.getElementById("j-log").textContent.includes("step=6")`)
	tb.until("the progress text", `document.getElementById("j-progress-text").textContent.includes("step 6 of 7")`)
	tb.screenshot("job-progress-log")
	release()
	tb.until("the page to show COMPLETED", `document.querySelector('[data-field="state"] .COMPLETED') !== null`)
	tb.until("the last progress", `document.getElementById("j-progress-text").textContent === "100% — done"`)
	tb.until("the last log record", `document.getElementById("j-log").textContent.includes("finished")`)
	if got := tb.eval(`window.__notReloaded`); got != "yes" {
		t.Errorf("the page reloaded (marker %q)", got)
	}
	tb.noConsoleErrors()
}

// TestJobPageLoadsTheLogOnceMoreWhenTheJobEnds: a log poll still in flight when the
// page sees the job complete must not cost the log its last records. The page's fetch
// of the log is held (answered with what was stored before the job ended) until the
// page shows COMPLETED, so the refresh that saw the end found a load in flight.
func TestJobPageLoadsTheLogOnceMoreWhenTheJobEnds(t *testing.T) {
	browser := startBrowser(t)
	s := start(t, false, nil)
	release := startChatty(t, s)
	id := s.submit(t, "CHATTY", chattyArgs{Steps: 2})

	tb := openTab(t, browser, s.url, screenshotDir(t))
	tb.open("#/job/" + id)
	tb.until("the log growing live", `document.getElementById("j-log").textContent.includes("step=2")`)
	// The next log fetch is sent, and its answer kept from the page until let go.
	tb.eval(`(() => {
		const fetch0 = window.fetch;
		window.__held = [];
		window.fetch = (url, opts) => {
			const p = fetch0(url, opts);
			if (!String(url).includes("/logs?") || window.__held.length) return p;
			return new Promise((resolve) => window.__held.push(() => resolve(p)));
		};
		return "";
	})()`)
	tb.until("a log fetch in flight", `window.__held.length === 1`)
	release()
	tb.until("the page to show COMPLETED", `document.querySelector('[data-field="state"] .COMPLETED') !== null`)
	tb.eval(`(window.__held[0](), "")`)
	tb.until("the last log record", `document.getElementById("j-log").textContent.includes("finished")`)
	tb.noConsoleErrors()
}

// TestJobLogsAPISaysWhichAttemptsHaveTheirLastChunk: a page of the log says, for each
// attempt with a chunk on it, whether the attempt's last chunk was read, which the
// worker ships once the handler returned: not while the handler runs, nor once its job
// was cancelled while it cleans up, and then on the page that reads that chunk.
func TestJobLogsAPISaysWhichAttemptsHaveTheirLastChunk(t *testing.T) {
	t.Parallel()
	s := start(t, false, nil)
	startChatty(t, s)
	id := s.submit(t, "CHATTY", chattyArgs{Steps: 1, CleanupMillis: 300})
	type logPage struct {
		Records []struct {
			Record struct {
				Msg string `json:"msg"`
			} `json:"record"`
		} `json:"records"`
		Next  uint64          `json:"next"`
		Final map[string]bool `json:"final"`
	}
	var page logPage
	testkit.Eventually(t, waitFor, "the first record", func() bool {
		return getJSON(t, s.url+"/api/jobs/"+id+"/logs", &page) == http.StatusOK && len(page.Records) == 1
	})
	if final, ok := page.Final["1"]; !ok || final {
		t.Fatalf("final of a running attempt's log: %v, want attempt 1 false", page.Final)
	}
	if ok, _, err := s.cl.Cancel(context.Background(), id); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	// Read on from there, as the job page does, until attempt 1's last chunk.
	var msgs []string
	final := false
	testkit.Eventually(t, waitFor, "attempt 1's last chunk", func() bool {
		var p logPage
		if getJSON(t, fmt.Sprintf("%s/api/jobs/%s/logs?after=%d", s.url, id, page.Next), &p) != http.StatusOK {
			return false
		}
		for _, r := range p.Records {
			msgs = append(msgs, r.Record.Msg)
		}
		if f, ok := p.Final["1"]; ok {
			final = f
		}
		page.Next = p.Next
		return final
	})
	if strings.Join(msgs, ",") != "cleaning up,cleaned up" {
		t.Fatalf("records after the cancel %q, want the handler's cleanup", msgs)
	}
	if j, err := s.cl.Status(context.Background(), id); err != nil || j.State != protocol.StateCancelled {
		t.Fatalf("job: %+v %v", j, err)
	}
	if code := getJSON(t, s.url+"/api/jobs/"+id+"/logs", &page); code != http.StatusOK || len(page.Records) != 3 || !page.Final["1"] || len(page.Final) != 1 {
		t.Fatalf("the whole log: %d %+v", code, page)
	}
}

// TestJobPageFollowsACancelledHandlersCleanup: a job cancelled from its page ends at
// once, but its handler logs as it cleans up, for longer than the page takes to show
// the end: the page polls the log on until the attempt's last chunk, so the cleanup's
// last record shows without a reload.
func TestJobPageFollowsACancelledHandlersCleanup(t *testing.T) {
	browser := startBrowser(t)
	s := start(t, false, nil)
	startChatty(t, s)
	id := s.submit(t, "CHATTY", chattyArgs{Steps: 1, CleanupMillis: 800})

	tb := openTab(t, browser, s.url, screenshotDir(t))
	tb.open("#/job/" + id)
	tb.until("the job page to show RUNNING", `document.querySelector('[data-field="state"] .RUNNING') !== null`)
	tb.until("the log of the running job", `document.getElementById("j-log").textContent.includes("step=1")`)
	tb.click("click cancel", "#j-cancel")
	tb.until("the page to show CANCELLED", `document.querySelector('[data-field="state"] .CANCELLED') !== null`)
	tb.until("the cleanup's last record", `document.getElementById("j-log").textContent.includes("cleaned up")`)
	tb.noConsoleErrors()
}
