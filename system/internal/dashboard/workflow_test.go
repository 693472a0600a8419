package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
)

func TestWorkflowAPI(t *testing.T) {
	t.Parallel()
	s := start(t, true, nil)
	w := client.NewWorkflow("api").Step("a", "SHA256", map[string]string{"text": "a"}).Step("b", "SHA256", map[string]string{"text": "b"}).Chain("a", "b")
	if _, err := s.cl.SubmitWorkflow(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	var st protocol.WorkflowStatus
	testkit.Eventually(t, waitFor, "the workflow COMPLETED", func() bool {
		resp, err := http.Get(s.url + "/api/workflows/api")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		st = protocol.WorkflowStatus{}
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&st) == nil && st.State == "COMPLETED"
	})
	if len(st.Steps) != 2 || st.Steps[1].Name != "b" || len(st.Steps[1].After) != 1 || st.Steps[1].After[0] != "a" {
		t.Fatalf("workflow %+v, want b after a", st)
	}
	resp, err := http.Get(s.url + "/api/workflows/nope")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown workflow: %s, want 404", resp.Status)
	}
}

// TestWorkflowGraphInBrowser draws a diamond workflow live: its boxes change colour as
// the steps run, its edges are arrows from parent to child, its steps link to their
// job pages, and the job page links back to the graph.
func TestWorkflowGraphInBrowser(t *testing.T) {
	browser := startBrowser(t)
	shots := screenshotDir(t)
	s := start(t, false, nil)
	// The worker starts once the page shows the graph: a browser slow to start under
	// load missed a RUNNING extract that was over before the page was.
	wf := client.NewWorkflow("diamond").
		Step("extract", "SLEEP", map[string]int{"durationMillis": 3000}).
		Step("left", "WORD_COUNT", map[string]string{"text": "a b"}, client.StepAfter("extract")).
		Step("right", "FAIL", map[string]int{"failUntilAttempt": 2}, client.StepAfter("extract"), client.StepMaxAttempts(2)).
		Step("load", "SLEEP", map[string]int{"durationMillis": 300}, client.StepAfter("left", "right"))
	sub, err := s.cl.SubmitWorkflow(context.Background(), wf)
	if err != nil {
		t.Fatal(err)
	}
	tb := openTab(t, browser, s.url, shots)
	tb.open("#/workflow/diamond")
	tb.until("four boxes and four arrows", `document.querySelectorAll("#w-graph a.step").length === 4 && document.querySelectorAll("#w-graph path.edge[marker-end]").length === 4`)
	w, _ := s.StartNativeWorker(t)
	testkit.Eventually(t, waitFor, "worker listed", func() bool { return jobbustest.WorkerListed(s.cl, w.ID()) })
	tb.until("extract running while load waits", `document.querySelector('#w-graph [data-step="extract"]').dataset.state === "RUNNING" && document.querySelector('#w-graph [data-step="load"]').dataset.state === "WAITING"`)
	if got := tb.eval(`getComputedStyle(document.querySelector('#w-graph [data-step="extract"] rect')).fill`); got == tb.eval(`getComputedStyle(document.querySelector('#w-graph [data-step="load"] rect')).fill`) {
		t.Errorf("a RUNNING and a WAITING box share the colour %s", got)
	}
	tb.screenshot("workflow-running")
	// Columns: each step right of its parents; the arrows run from parent to child.
	xs := map[string]float64{}
	for _, step := range []string{"extract", "left", "right", "load"} {
		v, err := strconv.ParseFloat(tb.eval(fmt.Sprintf(`document.querySelector('#w-graph [data-step="%s"] rect').getAttribute("x")`, step)), 64)
		if err != nil {
			t.Fatal(err)
		}
		xs[step] = v
	}
	if !(xs["extract"] < xs["left"] && xs["left"] == xs["right"] && xs["right"] < xs["load"]) {
		t.Errorf("columns %v, want extract | left, right | load", xs)
	}
	if got := tb.eval(`Array.from(document.querySelectorAll("#w-graph path.edge")).map(e => e.dataset.from + ">" + e.dataset.to).sort().join(" ")`); got != "extract>left extract>right left>load right>load" {
		t.Errorf("edges %q", got)
	}
	tb.eval(`window.__notReloaded = "yes"`)
	extract := `document.querySelector('#w-graph [data-step="extract"]')`
	tb.until("extract COMPLETED", extract+`.dataset.state === "COMPLETED"`)
	tb.eval(`window.__extract = ` + extract + `; "kept"`)
	tb.until("every step COMPLETED, live", `Array.from(document.querySelectorAll("#w-graph a.step")).every(a => a.dataset.state === "COMPLETED") && document.querySelector("#w-state .COMPLETED") !== null`)
	if got := tb.eval(`window.__notReloaded`); got != "yes" {
		t.Errorf("the page reloaded")
	}
	// A click is a press and a release on one element: a redraw that replaced a step
	// whose state did not change could lose it.
	if got := tb.eval(`String(window.__extract === ` + extract + `)`); got != "true" {
		t.Errorf("the extract step's box was replaced while only other steps changed")
	}
	tb.screenshot("workflow-completed")
	tb.do("open the load step", chromedp.Click(chromedp.CSS(`#w-graph [data-step="load"] rect`)))
	tb.until("the job page of load", fmt.Sprintf(`!document.getElementById("job-view").hidden && document.getElementById("j-id").textContent === %q`, sub.Jobs["load"]))
	tb.until("its workflow linked", `document.querySelector('[data-field="workflow"] a[data-workflow="diamond"]') !== null && document.querySelector('[data-field="after"]').textContent.split(",").length === 2`)
	tb.do("back to the graph", chromedp.Click(chromedp.CSS(`[data-field="workflow"] a`)))
	tb.until("the graph again", `!document.getElementById("workflow-view").hidden && document.querySelectorAll("#w-graph a.step").length === 4`)
	if strings.Contains(tb.eval(`document.getElementById("w-note").textContent`), "Unknown") {
		t.Errorf("note %q", tb.eval(`document.getElementById("w-note").textContent`))
	}
	tb.noConsoleErrors()
}
