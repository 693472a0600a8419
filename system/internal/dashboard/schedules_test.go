package dashboard_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/system/internal/dashboard"
)

// TestSchedulesPanel: the dashboard lists the schedules with their state, next and last
// run and last error, and pauses and resumes one only with the page's token.
func TestSchedulesPanel(t *testing.T) {
	t.Parallel()
	s := start(t, false, nil)
	ctx := context.Background()
	if _, err := s.cl.AddSchedule(ctx, client.Schedule{Name: "beat", Every: time.Second, TaskType: "SHA256", Payload: map[string]string{"text": "x"}}); err != nil {
		t.Fatal(err)
	}
	type page struct {
		Schedules []protocol.Schedule `json:"schedules"`
		NowMillis int64               `json:"nowMillis"`
	}
	list := func() protocol.Schedule {
		t.Helper()
		var p page
		if code := getJSON(t, s.url+"/api/schedules", &p); code != http.StatusOK || len(p.Schedules) != 1 || p.NowMillis == 0 {
			t.Fatalf("GET /api/schedules: %d %+v", code, p)
		}
		return p.Schedules[0]
	}
	var sc protocol.Schedule
	testkit.Eventually(t, waitFor, "a run listed", func() bool { sc = list(); return sc.LastJobID != "" })
	if sc.Name != "beat" || sc.EveryMillis != 1000 || sc.NextTickMillis <= sc.LastTickMillis || sc.Paused {
		t.Fatalf("listed %+v", sc)
	}
	post := func(path string, headers map[string]string) (int, map[string]json.RawMessage) {
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
		var body map[string]json.RawMessage
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	if code, _ := post("/api/schedules/beat/pause", nil); code != http.StatusForbidden {
		t.Fatalf("pause without the token: %d", code)
	}
	if list().Paused {
		t.Fatal("a refused pause paused")
	}
	good := map[string]string{dashboard.TokenHeader: s.token(t), "Origin": s.url}
	if code, body := post("/api/schedules/beat/pause", good); code != http.StatusOK {
		t.Fatalf("pause: %d %s", code, body["error"])
	}
	if sc := list(); !sc.Paused || sc.NextTickMillis != 0 {
		t.Fatalf("after pause: %+v", sc)
	}
	if code, body := post("/api/schedules/beat/resume", good); code != http.StatusOK {
		t.Fatalf("resume: %d %s", code, body["error"])
	}
	if sc := list(); sc.Paused || sc.NextTickMillis == 0 {
		t.Fatalf("after resume: %+v", sc)
	}
	if code, body := post("/api/schedules/nope/pause", good); code != http.StatusNotFound || !strings.Contains(string(body["error"]), "Unknown schedule: nope") {
		t.Fatalf("pause of an unknown schedule: %d %s", code, body["error"])
	}
}
