package dashboard_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/cli"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
)

// The browser tests drive a real headless Chromium (Debian's chromium package)
// through the DevTools protocol against a running system. Without Chromium they skip,
// unless JOBBUS_REQUIRE_BROWSER=1 (as .ci/run sets), when they fail.

// browserWait bounds each wait for the page: generous, since a loaded -race run is slow.
const browserWait = 30 * time.Second

func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("JOBBUS_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const how = "chromium not found: install it (apt-get install -y chromium) or set JOBBUS_CHROMIUM"
	if os.Getenv("JOBBUS_REQUIRE_BROWSER") == "1" {
		t.Fatal(how + "; JOBBUS_REQUIRE_BROWSER=1 requires the browser tests")
	}
	t.Skip(how + " (JOBBUS_REQUIRE_BROWSER=1 turns this skip into a failure)")
	return ""
}

// screenshotDir is where screenshots go: $JOBBUS_ARTIFACTS/screenshots, else
// artifacts/screenshots at the module root, which git ignores.
func screenshotDir(t *testing.T) string {
	t.Helper()
	root := os.Getenv("JOBBUS_ARTIFACTS")
	if root == "" {
		dir, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				break
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				t.Fatal("no go.mod above the test's directory")
			}
			dir = parent
		}
		root = filepath.Join(dir, "artifacts")
	}
	dir := filepath.Join(root, "screenshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startBrowser starts Chromium with a fresh profile and returns a context whose tabs
// run in it; the browser stops when the test ends. The flags keep it from reaching
// the network by itself (background networking, component updates, sync, QUIC).
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath(t)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("mute-audio", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	// The first run starts the browser; it must not have a timeout of its own.
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	return browser
}

// tab is one browser tab on the dashboard, with the console errors it logged.
type tab struct {
	t    *testing.T
	ctx  context.Context
	base string
	shot string

	mu     sync.Mutex
	errors []string
}

func openTab(t *testing.T, browser context.Context, base, shots string) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // opens the tab
		t.Fatal(err)
	}
	tb := &tab{t: t, ctx: ctx, base: base, shot: shots}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				tb.mu.Lock()
				tb.errors = append(tb.errors, m.String()+" at "+m.URL)
				tb.mu.Unlock()
			}
		}
	}()
	return tb
}

// do runs actions within browserWait.
func (tb *tab) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, browserWait)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tb.t.Fatalf("%s: %v (console errors: %v)", what, err, tb.consoleErrors())
	}
}

// click clicks the element sel finds, again when the page redrew it between finding
// and clicking it: the counts and lists are drawn afresh at every live update, and a
// node found a moment before may be gone ("Could not find node with given id").
func (tb *tab) click(what, sel string) {
	tb.t.Helper()
	deadline := time.Now().Add(browserWait)
	for {
		ctx, cancel := context.WithTimeout(tb.ctx, browserWait)
		err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(sel)))
		cancel()
		switch {
		case err == nil:
			return
		case !strings.Contains(err.Error(), "Could not find node") || time.Now().After(deadline):
			tb.t.Fatalf("%s: %v (console errors: %v)", what, err, tb.consoleErrors())
		}
	}
}

// until waits until the JavaScript expression is true.
func (tb *tab) until(what, expr string) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, browserWait)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(20*time.Millisecond))); err != nil {
		tb.t.Fatalf("waiting for %s (%s): %v (console errors: %v)", what, expr, err, tb.consoleErrors())
	}
}

func (tb *tab) eval(expr string) string {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, browserWait)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		tb.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// open loads the dashboard at fragment (say "#/job/<id>") and waits until it is live.
func (tb *tab) open(fragment string) {
	tb.t.Helper()
	tb.do("load the dashboard", chromedp.Navigate(tb.base+"/"+fragment), chromedp.WaitVisible(chromedp.CSS("header .brand")))
	// One count per state, the extensions' (SCHEDULED, WAITING) included.
	tb.until("the live updates", fmt.Sprintf(`document.getElementById("conn").textContent === "live" && document.querySelectorAll("#counts .count").length === %d`, len(protocol.States)))
}

// screenshot saves the whole page as name.png; viewportOnly keeps to what the screen
// shows (a phone's).
func (tb *tab) screenshot(name string, viewportOnly ...bool) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, browserWait)
	defer cancel()
	action := chromedp.FullScreenshot(100)
	if len(viewportOnly) > 0 && viewportOnly[0] {
		action = chromedp.CaptureScreenshot()
	}
	png, err := chromedp.Run(ctx, action)
	if err != nil {
		tb.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(tb.shot, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tb.t.Fatal(err)
	}
	tb.t.Logf("screenshot %s", path)
}

func (tb *tab) consoleErrors() []string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]string(nil), tb.errors...)
}

func (tb *tab) noConsoleErrors() {
	tb.t.Helper()
	if errs := tb.consoleErrors(); len(errs) > 0 {
		tb.t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}

// runCLI runs the jobbus command line in-process against the system's NATS.
func runCLI(t *testing.T, natsURL string, args ...string) string {
	t.Helper()
	var out, errs bytes.Buffer
	if code := cli.Run(append([]string{"jobbus", "--nats", natsURL}, args...), &out, &errs); code != cli.ExitOK {
		t.Fatalf("jobbus %s: exit %d: %s", strings.Join(args, " "), code, errs.String())
	}
	return strings.TrimSpace(out.String())
}

func TestDashboardInBrowser(t *testing.T) {
	browser := startBrowser(t)
	shots := screenshotDir(t)
	// Long retry delays keep a failing job's RETRY_WAIT visible; workers of two slots.
	s := start(t, false, nil, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) {
		c.RetryBaseDelay, c.RetryMaxDelay = 200*time.Millisecond, 200*time.Millisecond
	}))
	for range 2 {
		w, _ := s.StartNativeWorker(t)
		testkit.Eventually(t, waitFor, "worker listed", func() bool { return jobbustest.WorkerListed(s.cl, w.ID()) })
	}
	natsURL := s.Server.ClientURL()
	ctx := context.Background()

	t.Run("LoadsWithoutConsoleErrors", func(t *testing.T) {
		tb := openTab(t, browser, s.url, shots)
		tb.open("")
		if got := tb.eval(`document.title`); got != "jobbus" {
			t.Errorf("title %q", got)
		}
		tb.until("both workers listed", `document.querySelectorAll("#workers tr[data-worker]").length === 2`)
		tb.noConsoleErrors()
	})

	t.Run("CLIJobTurnsCompletedWithoutReload", func(t *testing.T) {
		tb := openTab(t, browser, s.url, shots)
		tb.open("")
		tb.eval(`window.__notReloaded = "yes"`)
		id := runCLI(t, natsURL, "submit", "sleep", "--milliseconds", "700")
		row := fmt.Sprintf(`document.querySelector('#jobs tr[data-job="%s"]')`, id)
		tb.until("the job to appear", row+` !== null`)
		tb.until("the job to run", row+`.dataset.state === "RUNNING"`)
		tb.screenshot("dashboard-running")
		tb.until("the job to complete", row+`.dataset.state === "COMPLETED"`)
		if got := tb.eval(`window.__notReloaded`); got != "yes" {
			t.Errorf("the page reloaded (marker %q)", got)
		}
		tb.noConsoleErrors()
	})

	// A click is a press and a release on one element: a live update that replaced the
	// counts or a row's buttons between the two would lose it.
	t.Run("LiveUpdatesKeepButtonsInPlace", func(t *testing.T) {
		id, err := s.cl.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 120000})
		if err != nil {
			t.Fatal(err)
		}
		tb := openTab(t, browser, s.url, shots)
		tb.open("")
		cancel := fmt.Sprintf(`document.querySelector('#jobs button[data-cancel="%s"]')`, id)
		completed := `document.querySelector('#counts [data-state="COMPLETED"]')`
		tb.until("the running job's cancel button", cancel+` !== null`)
		before := tb.eval(completed + `.querySelector("b").textContent`)
		tb.eval(`window.__cancel = ` + cancel + `; window.__count = ` + completed + `; "kept"`)
		other, err := s.cl.Submit(ctx, "SHA256", map[string]string{"text": "a live update"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.cl.Wait(ctx, other); err != nil {
			t.Fatal(err)
		}
		tb.until("the other job listed COMPLETED", fmt.Sprintf(`document.querySelector('#jobs tr[data-job="%s"][data-state="COMPLETED"]') !== null`, other))
		tb.until("the count moved", completed+`.querySelector("b").textContent !== `+fmt.Sprintf("%q", before))
		if got := tb.eval(`String(window.__count === ` + completed + `) + " " + String(window.__cancel === ` + cancel + `)`); got != "true true" {
			t.Errorf("after a live update, the same count button and cancel button (true true): %s", got)
		}
		if _, _, err := s.cl.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		tb.noConsoleErrors()
	})

	t.Run("CancelFromTheJobPage", func(t *testing.T) {
		id, err := s.cl.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 120000})
		if err != nil {
			t.Fatal(err)
		}
		tb := openTab(t, browser, s.url, shots)
		tb.open("#/job/" + id)
		tb.until("the job page to show RUNNING", `document.querySelector('[data-field="state"] .RUNNING') !== null`)
		tb.do("click cancel", chromedp.Click(chromedp.ID("j-cancel")))
		tb.until("the page to show CANCELLED", `document.querySelector('[data-field="state"] .CANCELLED') !== null`)
		tb.until("the cancel button to be disabled", `document.getElementById("j-cancel").disabled`)
		j, err := s.cl.Status(ctx, id)
		if err != nil || j.State != protocol.StateCancelled || j.Error == nil || *j.Error != "cancelled by client request" {
			t.Fatalf("job after the page's cancel: %+v %v", j, err)
		}
		tb.screenshot("job-cancelled")
		tb.noConsoleErrors()
	})

	t.Run("JobPageShowsTheErrorOfAFailJob", func(t *testing.T) {
		id, err := s.cl.Submit(ctx, "FAIL", map[string]int{"failUntilAttempt": 9}, client.MaxAttempts(2))
		if err != nil {
			t.Fatal(err)
		}
		tb := openTab(t, browser, s.url, shots)
		tb.open("#/job/" + id)
		tb.until("the page to show FAILED", `document.querySelector('[data-field="state"] .FAILED') !== null`)
		want := "deliberate failure on attempt 2 (failing until 9) (all 2 attempts used)"
		tb.until("the error shown", fmt.Sprintf(`document.getElementById("j-error").textContent === %q`, want))
		tb.until("the first attempt's error in the history", `document.getElementById("j-history").textContent.includes("deliberate failure on attempt 1")`)
		tb.screenshot("job-failed")
		tb.noConsoleErrors()
	})

	t.Run("ResubmitFromTheJobPage", func(t *testing.T) {
		id, err := s.cl.Submit(ctx, "SHA256", map[string]string{"text": "again"})
		if err != nil {
			t.Fatal(err)
		}
		tb := openTab(t, browser, s.url, shots)
		tb.open("#/job/" + id)
		tb.until("the job to complete", `document.querySelector('[data-field="state"] .COMPLETED') !== null`)
		tb.do("click resubmit", chromedp.Click(chromedp.ID("j-resubmit")))
		tb.until("the new job's page", fmt.Sprintf(`location.hash.startsWith("#/job/") && !location.hash.endsWith(%q) && document.getElementById("j-id").textContent.length > 0 && document.getElementById("j-id").textContent !== %q`, id, id))
		newID := strings.TrimPrefix(tb.eval(`location.hash`), "#/job/")
		j, err := s.cl.Wait(ctx, newID)
		if err != nil || j.TaskType != "SHA256" || j.State != protocol.StateCompleted {
			t.Fatalf("resubmitted job %s: %+v %v", newID, j, err)
		}
		tb.noConsoleErrors()
	})

	t.Run("OverviewWithTrafficAndFilters", func(t *testing.T) {
		tb := openTab(t, browser, s.url, shots)
		tb.open("")
		// Two seconds of traffic for the charts: completions, some failures.
		deadline := time.Now().Add(2 * time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			task, payload := "SHA256", any(map[string]string{"text": fmt.Sprint(i)})
			if i%7 == 0 {
				task, payload = "FAIL", map[string]int{"failUntilAttempt": 2}
			}
			if _, err := s.cl.Submit(ctx, task, payload, client.MaxAttempts(1)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := s.cl.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 60000}); err != nil {
			t.Fatal(err)
		}
		tb.until("the throughput chart drawn", `document.querySelectorAll("#chart-throughput polyline").length === 3`)
		tb.until("completions counted", `parseInt(document.querySelector('#counts [data-state="COMPLETED"] b').textContent) > 10`)
		tb.until("a job running, its worker busy", `document.querySelector('#jobs tr[data-state="RUNNING"]') !== null && document.querySelector('#counts [data-state="RUNNING"] b').textContent === "1" && document.getElementById("workers-sum").textContent.includes("1 of 8")`)
		tb.screenshot("dashboard-overview")

		// Filter by state from its count, then by task type.
		tb.click("filter FAILED", `#counts [data-state="FAILED"]`)
		tb.until("only FAILED rows", `(() => { const r = document.querySelectorAll("#jobs tr[data-job]"); return r.length > 0 && Array.from(r).every(x => x.dataset.state === "FAILED"); })()`)
		tb.do("filter the type", chromedp.SetValue(chromedp.ID("f-type"), "FAIL"))
		tb.eval(`String(document.getElementById("f-type").dispatchEvent(new Event("change")))`)
		tb.until("only FAIL rows", `(() => { const r = document.querySelectorAll("#jobs tr[data-job]"); return r.length > 0 && Array.from(r).every(x => x.querySelector('[data-k="type"]').textContent === "FAIL"); })()`)
		tb.screenshot("dashboard-filtered")
		tb.noConsoleErrors()
	})

	t.Run("QueuesPagePausesAndResumes", func(t *testing.T) {
		// No worker serves "reports": its job waits there.
		id, err := s.cl.Submit(ctx, "SHA256", map[string]string{"text": "report"}, client.Queue("reports"))
		if err != nil {
			t.Fatal(err)
		}
		tb := openTab(t, browser, s.url, shots)
		tb.open("#/queues")
		row := `document.querySelector('#queues tr[data-queue="reports"]')`
		tb.until("the queue listed with its job", row+` !== null && `+row+`.querySelector('[data-k="queued"]').textContent === "1"`)
		if got := tb.eval(row + `.querySelector('[data-k="unfinished"]').textContent`); got != "1" {
			t.Errorf("the queue's unfinished jobs shown as %q, want 1", got)
		}
		tb.until("its depth chart drawn", row+`.querySelector('.spark polyline') !== null`)
		tb.click("click pause", `#queues button[data-pause="reports"]`)
		tb.until("the queue shown paused", row+`.dataset.paused === "yes"`)
		if qs, err := s.cl.Queues(ctx); err != nil || !pausedIn(qs, "reports") {
			t.Fatalf("after the page's pause: %+v %v", qs, err)
		}
		tb.screenshot("queues-paused")
		tb.click("click resume", `#queues button[data-resume="reports"]`)
		tb.until("the queue shown running", row+`.dataset.paused === "no"`)
		if qs, err := s.cl.Queues(ctx); err != nil || pausedIn(qs, "reports") {
			t.Fatalf("after the page's resume: %+v %v", qs, err)
		}
		if _, _, err := s.cl.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		tb.noConsoleErrors()
	})

	t.Run("PhoneSizedScreen", func(t *testing.T) {
		tb := openTab(t, browser, s.url, shots)
		tb.do("emulate a phone", chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile))
		tb.open("")
		tb.until("rows shown", `document.querySelectorAll("#jobs tr[data-job]").length > 0`)
		if got := tb.eval(`String(document.documentElement.scrollWidth <= window.innerWidth) + " " + document.documentElement.scrollWidth + "/" + window.innerWidth`); !strings.HasPrefix(got, "true") {
			t.Errorf("the page is wider than a phone: %s", got)
		}
		if got := tb.eval(`getComputedStyle(document.querySelector("table.jobs thead")).display`); got != "none" {
			t.Errorf("the job table keeps its header on a phone: display %s", got)
		}
		tb.screenshot("phone-overview", true)
		id := tb.eval(`document.querySelector("#jobs tr[data-job]").dataset.job`)
		tb.click("open a job", `#jobs tr[data-job="`+id+`"] a`)
		tb.until("the job page", `!document.getElementById("job-view").hidden && document.getElementById("j-id").textContent === `+fmt.Sprintf("%q", id))
		if got := tb.eval(`String(document.documentElement.scrollWidth <= window.innerWidth)`); got != "true" {
			t.Errorf("the job page is wider than a phone")
		}
		tb.screenshot("phone-job", true)
		tb.noConsoleErrors()
	})
}

func pausedIn(qs []protocol.QueueInfo, name string) bool {
	for _, q := range qs {
		if q.Name == name {
			return q.Paused
		}
	}
	return false
}
