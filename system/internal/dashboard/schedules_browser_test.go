package dashboard_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestSchedulesInBrowser: the overview lists a schedule (a CLI-added one) with its next
// and last run, and its pause button pauses it, then resumes it.
func TestSchedulesInBrowser(t *testing.T) {
	browser := startBrowser(t)
	shots := screenshotDir(t)
	s := start(t, true, nil)
	runCLI(t, s.Server.ClientURL(), "schedule", "add", "beat", "--every", "1s", "sha256", "--text", "hi")
	tb := openTab(t, browser, s.url, shots)
	tb.open("")
	row := `document.querySelector('#schedules tr[data-schedule="beat"]')`
	tb.until("the schedule listed with a run", row+` !== null && `+row+`.querySelector('[data-k="last"] a') !== null`)
	tb.until("its next run", row+`.querySelector('[data-k="next"]').textContent.startsWith("in ")`)
	tb.screenshot("schedules")
	jobID := tb.eval(row + `.querySelector('[data-k="last"] a').title`)
	tb.do("open its last job", chromedp.Click(`#schedules tr[data-schedule="beat"] [data-k="last"] a`))
	tb.until("the job page naming the schedule", `document.getElementById("j-id").textContent === "`+jobID+`" && document.querySelector('[data-field="schedule"]') !== null && document.querySelector('[data-field="schedule"]').textContent === "beat"`)
	tb.open("")
	tb.do("click pause", chromedp.Click(`#schedules tr[data-schedule="beat"] button[data-schedule-action="pause"]`))
	tb.until("shown paused", row+`.dataset.state === "paused"`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	scs, err := s.cl.Schedules(ctx)
	if err != nil || len(scs) != 1 || !scs[0].Paused {
		t.Fatalf("after the page's pause: %+v %v", scs, err)
	}
	tb.do("click resume", chromedp.Click(`#schedules tr[data-schedule="beat"] button[data-schedule-action="resume"]`))
	tb.until("shown active", row+`.dataset.state === "active"`)
	tb.noConsoleErrors()
}
