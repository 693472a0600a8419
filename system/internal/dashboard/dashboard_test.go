package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/system/internal/dashboard"
)

const waitFor = 10 * time.Second

// system is a jobbus system with a dashboard served over HTTP.
type system struct {
	*jobbustest.System
	url string
	cl  *client.Client
}

func start(t *testing.T, withWorker bool, mods []func(*dashboard.Config), opts ...jobbustest.Option) *system {
	t.Helper()
	sys := jobbustest.Start(t, opts...)
	cfg := dashboard.Config{NC: sys.NC, UpdateInterval: 100 * time.Millisecond, WorkerPoll: 100 * time.Millisecond}
	for _, m := range mods {
		m(&cfg)
	}
	d, err := dashboard.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(func() { srv.Close(); _ = d.Close() })
	s := &system{System: sys, url: srv.URL, cl: client.New(sys.NC, client.WithTimeout(waitFor))}
	if withWorker {
		w, _ := sys.StartNativeWorker(t)
		testkit.Eventually(t, waitFor, "worker listed", func() bool { return jobbustest.WorkerListed(s.cl, w.ID()) })
	}
	return s
}

func (s *system) submit(t *testing.T, taskType string, payload any, opts ...client.SubmitOption) string {
	t.Helper()
	id, err := s.cl.Submit(context.Background(), taskType, payload, opts...)
	if err != nil {
		t.Fatalf("submit %s: %v", taskType, err)
	}
	return id
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: decode: %v", url, err)
	}
	return resp.StatusCode
}

type page struct {
	Jobs []struct {
		JobID    string         `json:"jobId"`
		TaskType string         `json:"taskType"`
		State    protocol.State `json:"state"`
	} `json:"jobs"`
	NextCursor string `json:"nextCursor"`
	Loaded     bool   `json:"loaded"`
}

func (s *system) page(t *testing.T, query string) page {
	t.Helper()
	var p page
	if code := getJSON(t, s.url+"/api/jobs?"+query, &p); code != http.StatusOK {
		t.Fatalf("GET /api/jobs?%s: %d", query, code)
	}
	return p
}

// token reads the write token from the page, as its script does.
func (s *system) token(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(s.url + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`name="jobbus-token" content="([0-9a-f]+)"`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no token in the page:\n%s", body)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("page served without a framing policy: %q", csp)
	}
	return string(m[1])
}

func TestJobListFiltersAndPages(t *testing.T) {
	t.Parallel()
	s := start(t, false, nil) // no worker: the jobs stay QUEUED
	var ids []string
	for i := range 5 {
		ids = append(ids, s.submit(t, "SHA256", map[string]string{"text": fmt.Sprint(i)}))
	}
	ids = append(ids, s.submit(t, "WORD_COUNT", map[string]string{"text": "a b"}))
	cancelled := ids[1]
	if ok, _, err := s.cl.Cancel(context.Background(), cancelled); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	testkit.Eventually(t, waitFor, "the dashboard to see every job", func() bool {
		p := s.page(t, "")
		return p.Loaded && len(p.Jobs) == 6 && p.Jobs[4].State == protocol.StateCancelled
	})
	all := s.page(t, "")
	for i, j := range all.Jobs { // newest first
		if want := ids[len(ids)-1-i]; j.JobID != want {
			t.Fatalf("job %d is %s, want %s", i, j.JobID, want)
		}
	}
	if p := s.page(t, "type=WORD_COUNT"); len(p.Jobs) != 1 || p.Jobs[0].JobID != ids[5] {
		t.Errorf("type filter: %+v", p.Jobs)
	}
	if p := s.page(t, "state=CANCELLED"); len(p.Jobs) != 1 || p.Jobs[0].JobID != cancelled {
		t.Errorf("state filter: %+v", p.Jobs)
	}
	if p := s.page(t, "state=QUEUED&type=SHA256"); len(p.Jobs) != 4 {
		t.Errorf("both filters: %d jobs, want 4", len(p.Jobs))
	}
	// Pages of two, newest first, end to end.
	var seen []string
	cursor := ""
	for range 10 {
		p := s.page(t, "limit=2&cursor="+cursor)
		for _, j := range p.Jobs {
			seen = append(seen, j.JobID)
		}
		if cursor = p.NextCursor; cursor == "" {
			break
		}
	}
	if len(seen) != 6 || seen[0] != ids[5] || seen[5] != ids[0] {
		t.Errorf("paged through %v", seen)
	}
	var e struct{ Error string }
	if code := getJSON(t, s.url+"/api/jobs?state=NOPE", &e); code != http.StatusBadRequest || e.Error == "" {
		t.Errorf("bad state: %d %q", code, e.Error)
	}
}

func TestJobDetailHasPayloadHistoryAndError(t *testing.T) {
	t.Parallel()
	// A retry delay long enough for the RETRY_WAIT record to be stored on its own.
	s := start(t, true, nil, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) {
		c.RetryBaseDelay, c.RetryMaxDelay = 300*time.Millisecond, 300*time.Millisecond
	}))
	id := s.submit(t, "FAIL", map[string]int{"failUntilAttempt": 9}, client.MaxAttempts(2))
	var d struct {
		JobID    string          `json:"jobId"`
		State    protocol.State  `json:"state"`
		Attempts int             `json:"attempts"`
		Error    string          `json:"error"`
		Payload  json.RawMessage `json:"payload"`
		History  []struct {
			State protocol.State `json:"state"`
			Error string         `json:"error"`
		} `json:"history"`
		Fingerprint  *string `json:"fingerprint"`
		WorkerID     string  `json:"workerId"`
		LastWorkerID string  `json:"lastWorkerId"`
	}
	zero := d // each poll decodes afresh: a field an earlier answer had and this one omits must not linger
	testkit.Eventually(t, waitFor, "the job failed, its history seen", func() bool {
		d = zero
		getJSON(t, s.url+"/api/jobs/"+id, &d)
		return d.State == protocol.StateFailed && len(d.History) > 0 && d.History[len(d.History)-1].State == protocol.StateFailed
	})
	if d.Attempts != 2 || !strings.Contains(d.Error, "deliberate failure on attempt 2") || !strings.Contains(d.Error, "(all 2 attempts used)") {
		t.Errorf("detail: attempts %d, error %q", d.Attempts, d.Error)
	}
	if string(d.Payload) != `{"failUntilAttempt":9}` {
		t.Errorf("payload %s", d.Payload)
	}
	var retryErr string
	for _, h := range d.History {
		if h.State == protocol.StateRetryWait {
			retryErr = h.Error
		}
	}
	if !strings.Contains(retryErr, "deliberate failure on attempt 1") {
		t.Errorf("history kept no first-attempt error: %+v", d.History)
	}
	if d.Fingerprint != nil {
		t.Error("detail shows the idempotency fingerprint")
	}
	// The worker that ran the failed job stays on it: in the detail, and in the list.
	workers, err := s.cl.Workers(context.Background())
	if err != nil || len(workers) != 1 {
		t.Fatalf("workers %+v, %v", workers, err)
	}
	if ran := workers[0].WorkerID; d.WorkerID != "" || d.LastWorkerID != ran {
		t.Errorf("detail: workerId %q, lastWorkerId %q; want none while not running, and %s", d.WorkerID, d.LastWorkerID, ran)
	}
	var rows struct {
		Jobs []struct {
			JobID    string `json:"jobId"`
			WorkerID string `json:"workerId"`
		} `json:"jobs"`
	}
	getJSON(t, s.url+"/api/jobs", &rows)
	if len(rows.Jobs) != 1 || rows.Jobs[0].WorkerID != workers[0].WorkerID {
		t.Errorf("list rows %+v, want the failed job with worker %s", rows.Jobs, workers[0].WorkerID)
	}
	var e struct{ Error string }
	if code := getJSON(t, s.url+"/api/jobs/no-such-job", &e); code != http.StatusNotFound || !strings.Contains(e.Error, "Unknown job") {
		t.Errorf("unknown job: %d %q", code, e.Error)
	}
}

func TestWritesNeedTheTokenAndTheSameOrigin(t *testing.T) {
	t.Parallel()
	s := start(t, false, nil)
	tok := s.token(t)
	post := func(path string, headers map[string]string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.url+path, strings.NewReader("{}"))
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	id := s.submit(t, "SLEEP", map[string]int{"durationMillis": 60000})
	for _, tt := range []struct {
		name    string
		headers map[string]string
	}{
		{"NoToken", nil},
		{"WrongToken", map[string]string{dashboard.TokenHeader: strings.Repeat("0", len(tok))}},
		{"CrossSite", map[string]string{dashboard.TokenHeader: tok, "Sec-Fetch-Site": "cross-site"}},
		{"OtherOrigin", map[string]string{dashboard.TokenHeader: tok, "Origin": "http://evil.example"}},
	} {
		if code, body := post("/api/jobs/"+id+"/cancel", tt.headers); code != http.StatusForbidden {
			t.Errorf("%s: cancel answered %d %v", tt.name, code, body)
		}
		if code, _ := post("/api/jobs/"+id+"/resubmit", tt.headers); code != http.StatusForbidden {
			t.Errorf("%s: resubmit answered %d", tt.name, code)
		}
		if code, _ := post("/api/queues/default/pause", tt.headers); code != http.StatusForbidden {
			t.Errorf("%s: pause answered %d", tt.name, code)
		}
	}
	if qs, err := s.cl.Queues(context.Background()); err != nil || len(qs) != 1 || qs[0].Paused {
		t.Fatalf("a refused pause changed the queue: %+v %v", qs, err)
	}
	if j, _ := s.cl.Status(context.Background(), id); j.State != protocol.StateQueued {
		t.Fatalf("a refused cancel changed the job: %s", j.State)
	}
	if total := s.page(t, "").Jobs; len(total) > 1 {
		t.Fatalf("a refused resubmit submitted: %d jobs", len(total))
	}

	good := map[string]string{dashboard.TokenHeader: tok, "Origin": s.url, "Sec-Fetch-Site": "same-origin"}
	code, body := post("/api/jobs/"+id+"/resubmit", good)
	newID, _ := body["jobId"].(string)
	if code != http.StatusOK || newID == "" || newID == id {
		t.Fatalf("resubmit: %d %v", code, body)
	}
	again, err := s.cl.Status(context.Background(), newID)
	if err != nil || again.TaskType != "SLEEP" {
		t.Fatalf("resubmitted job: %+v %v", again, err)
	}
	if code, body := post("/api/jobs/"+id+"/cancel", good); code != http.StatusOK || body["cancelled"] != true {
		t.Fatalf("cancel: %d %v", code, body)
	}
	if j, _ := s.cl.Status(context.Background(), id); j.State != protocol.StateCancelled {
		t.Errorf("cancelled job is %s", j.State)
	}
	if code, body := post("/api/jobs/no-such-job/cancel", good); code != http.StatusNotFound {
		t.Errorf("cancel of an unknown job: %d %v", code, body)
	}
	if code, body := post("/api/queues/default/pause", good); code != http.StatusOK || body["paused"] != true {
		t.Errorf("pause: %d %v", code, body)
	}
	if code, body := post("/api/queues/default/resume", good); code != http.StatusOK || body["paused"] != nil {
		t.Errorf("resume: %d %v", code, body)
	}
	if code, body := post("/api/queues/nosuch/pause", good); code != http.StatusNotFound {
		t.Errorf("pause of an unknown queue: %d %v", code, body)
	}
	if code, body := post("/api/queues/a.b/pause", good); code != http.StatusBadRequest {
		t.Errorf("pause of a bad name: %d %v", code, body)
	}
}

// TestEventsAreRateLimited floods the system with jobs and counts the updates a page
// receives: at most one per UpdateInterval, whatever the job rate.
func TestEventsAreRateLimited(t *testing.T) {
	t.Parallel()
	const interval = 200 * time.Millisecond
	s := start(t, true, []func(*dashboard.Config){func(c *dashboard.Config) { c.UpdateInterval = interval }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/api/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	// When each update was made, by the server's clock: the times it was received
	// bunch up when the reader is slow (a loaded machine).
	events := make(chan time.Time, 1000)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var sum struct {
					NowMillis int64 `json:"nowMillis"`
				}
				if err := json.Unmarshal([]byte(data), &sum); err != nil {
					t.Errorf("event %q: %v", data, err)
				}
				events <- time.UnixMilli(sum.NowMillis)
			}
		}
	}()
	<-events // the first, at once

	stop := make(chan struct{})
	flooded := make(chan int)
	go func() {
		n := 0
		defer func() { flooded <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.cl.Submit(context.Background(), "SHA256", map[string]string{"text": "x"}); err == nil {
				n++
			}
		}
	}()
	window := 2 * time.Second
	start := time.Now()
	count := 0
	var last time.Time
	for time.Since(start) < window {
		select {
		case at, ok := <-events:
			if !ok {
				t.Fatal("event stream ended")
			}
			// Sent at least interval apart; a summary may be one another request made up
			// to interval/2 before (the dashboard's cache).
			if !last.IsZero() && at.Sub(last) < interval/2 {
				t.Errorf("two updates %v apart, for one per %v", at.Sub(last), interval)
			}
			last = at
			count++
		case <-time.After(window):
		}
	}
	close(stop)
	jobs := <-flooded
	if jobs < 20 {
		t.Fatalf("only %d jobs in the flood", jobs)
	}
	if max := int(window/interval) + 2; count > max || count < 2 {
		t.Errorf("%d updates in %v for %d jobs, want 2..%d", count, window, jobs, max)
	}
}

// TestWatchStopsWhenIdle: nobody looking, the dashboard stops following the job
// bucket (its consumer goes), and the next request starts it again.
func TestWatchStopsWhenIdle(t *testing.T) {
	t.Parallel()
	s := start(t, false, []func(*dashboard.Config){func(c *dashboard.Config) { c.IdleStop = 200 * time.Millisecond }})
	js, err := jetstream.New(s.NC)
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() int {
		st, err := js.Stream(context.Background(), "KV_"+protocol.JobsBucket)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	if n := consumers(); n != 0 {
		t.Fatalf("%d consumers before the dashboard was used", n)
	}
	id := s.submit(t, "SHA256", map[string]string{"text": "x"})
	testkit.Eventually(t, waitFor, "the dashboard to load the job", func() bool {
		p := s.page(t, "")
		return p.Loaded && len(p.Jobs) == 1
	})
	if n := consumers(); n != 1 {
		t.Fatalf("%d consumers while watching, want 1", n)
	}
	testkit.Eventually(t, waitFor, "the idle watch to stop", func() bool { return consumers() == 0 })
	testkit.Eventually(t, waitFor, "the next request to start it again", func() bool {
		p := s.page(t, "")
		return p.Loaded && len(p.Jobs) == 1 && p.Jobs[0].JobID == id && consumers() == 1
	})
}

// TestFirstListHasTheStoredJobs: the first request to a dashboard starts its watch of
// the job bucket; its answer waits for the stored jobs to be read, instead of an empty
// list that a script (or the table) would take for "no jobs".
func TestFirstListHasTheStoredJobs(t *testing.T) {
	t.Parallel()
	s := start(t, false, nil)
	for i := range 50 {
		s.submit(t, "SHA256", map[string]string{"text": fmt.Sprint(i)})
	}
	if p := s.page(t, "limit=500"); !p.Loaded || len(p.Jobs) != 50 {
		t.Errorf("first /api/jobs: loaded %v, %d jobs; want the 50 stored", p.Loaded, len(p.Jobs))
	}
}

// TestOnlyJobRecordsAreJobs: the job bucket holds more than job records (a
// schedule's settings, the leadership term); a job page or a resubmit naming one of
// those keys is an unknown job, not a job made up of whatever the key holds.
func TestOnlyJobRecordsAreJobs(t *testing.T) {
	t.Parallel()
	s := start(t, false, nil)
	ctx := context.Background()
	if _, err := s.cl.AddSchedule(ctx, client.Schedule{Name: "nightly", Every: time.Hour, TaskType: "SHA256", Payload: map[string]string{"text": "x"}}); err != nil {
		t.Fatal(err)
	}
	tok := s.token(t)
	for _, key := range []string{protocol.ControlPrefix + "schedule.nightly", protocol.TermKey} {
		var e struct{ Error string }
		if code := getJSON(t, s.url+"/api/jobs/"+key, &e); code != http.StatusNotFound || !strings.Contains(e.Error, "Unknown job") {
			t.Errorf("GET /api/jobs/%s: %d %q, want 404 Unknown job", key, code, e.Error)
		}
		req, _ := http.NewRequest(http.MethodPost, s.url+"/api/jobs/"+key+"/resubmit", nil)
		req.Header.Set(dashboard.TokenHeader, tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("resubmit %s: %d %s, want 404", key, resp.StatusCode, body)
		}
	}
	if l, err := s.cl.List(ctx, protocol.ListJobs{}); err != nil || len(l.Jobs) != 0 {
		t.Errorf("jobs made by resubmitting keys that are no jobs: %+v, %v", l.Jobs, err)
	}
}

// TestIdleStopLeavesTheNextWatchLive: a watch that the idle stop ends while it opens
// (after its bucket answered, before its jobs became the pages') must not replace the
// watch the next request started: the pages would read an index nobody fills, and
// see no job change again until the next idle stop.
func TestIdleStopLeavesTheNextWatchLive(t *testing.T) {
	t.Parallel()
	opened, release := make(chan context.Context, 1), make(chan struct{})
	var calls atomic.Int32
	hold := func(ctx context.Context) {
		if calls.Add(1) == 1 { // the first watch only
			opened <- ctx
			<-release
		}
	}
	s := start(t, false, []func(*dashboard.Config){
		func(c *dashboard.Config) { c.IdleStop = 500 * time.Millisecond },
		dashboard.WithWatchOpened(hold),
	})
	released := sync.OnceFunc(func() { close(release) })
	t.Cleanup(released)
	first := s.submit(t, "SHA256", map[string]string{"text": "first"})
	touch := func() {
		resp, err := http.Get(s.url + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	touch() // starts the first watch, which holds in the hook
	var old context.Context
	select {
	case old = <-opened:
	case <-time.After(waitFor):
		t.Fatal("the first watch never opened")
	}
	select {
	case <-old.Done(): // nobody asked for IdleStop: the idle stop ended it
	case <-time.After(waitFor):
		t.Fatal("the idle stop never ended the first watch")
	}
	if p := s.page(t, ""); !p.Loaded || len(p.Jobs) != 1 || p.Jobs[0].JobID != first {
		t.Fatalf("the request after the idle stop: %+v, want the first job loaded", p)
	}
	released() // the first watch goes on, ended: it must leave the second one be
	consumers := func() int {
		js, err := jetstream.New(s.NC)
		if err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(context.Background(), "KV_"+protocol.JobsBucket)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	// Its consumer goes once it returned; meanwhile requests keep the second live.
	testkit.Eventually(t, waitFor, "the first watch to end", func() bool { touch(); return consumers() == 1 })
	second := s.submit(t, "SHA256", map[string]string{"text": "second"})
	// Asked briefly, so that a page left unloaded (its answer waits for the load) does
	// not let the second watch go idle too, and the next request start a third.
	testkit.Eventually(t, waitFor, "the second job on the page", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/api/jobs", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var p page
		return json.NewDecoder(resp.Body).Decode(&p) == nil && p.Loaded && len(p.Jobs) == 2 &&
			(p.Jobs[0].JobID == second || p.Jobs[1].JobID == second)
	})
}
