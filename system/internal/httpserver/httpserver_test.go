package httpserver_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/system/internal/httpserver"
	"github.com/jobbus/jobbus/system/internal/metrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.IgnoreJetStreamAckWatcher()) }

const waitFor = 10 * time.Second

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func startServer(t *testing.T, cfg httpserver.Config) string {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	srv, err := httpserver.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + srv.Addr().String()
}

// TestHealthInEachState walks a system through the states /readyz tells apart; /healthz
// answers 200 throughout, as long as the process is up.
func TestHealthInEachState(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t, jobbustest.WithoutCoordinator())
	base := startServer(t, httpserver.Config{NC: sys.NC})

	expect := func(what string, status int, body string) {
		t.Helper()
		var gotStatus int
		var gotBody string
		testkit.Eventually(t, waitFor, what, func() bool {
			gotStatus, gotBody = get(t, base+"/readyz")
			return gotStatus == status && strings.Contains(gotBody, body)
		})
		if code, body := get(t, base+"/healthz"); code != http.StatusOK || body != "ok\n" {
			t.Errorf("%s: /healthz answered %d %q", what, code, body)
		}
	}

	expect("not ready before any coordinator ran", http.StatusServiceUnavailable, "not ready: KV bucket JOBS not reachable")

	stop := jobbustest.Go(t, func(ctx context.Context) error {
		return coordinator.Run(ctx, sys.NC, sys.Config, nil)
	})
	expect("ready while a coordinator leads", http.StatusOK, "ready: coordinator ")

	stop() // the leader gives its lease up
	expect("not ready once no coordinator leads", http.StatusServiceUnavailable, "not ready: "+coordinator.ErrNoLeader.Error())

	if err := sys.Server.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	expect("not ready without NATS", http.StatusServiceUnavailable, "not ready: NATS not connected")
}

// TestNotReadyWhileTheLeaderIsNotServing: a coordinator that holds the leader key but
// answers its API with "coordinator is not serving" (its lease may have run out by its
// own clock: paused, or its store stalled) is not ready; /readyz says why, and is ready
// again once the lease is renewed.
func TestNotReadyWhileTheLeaderIsNotServing(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t, jobbustest.WithoutCoordinator())
	cfg := sys.Config
	cfg.LeaderLease = time.Minute // no renewal (every third of it) within the test
	leading := make(chan *coordinator.Coordinator, 1)
	jobbustest.Go(t, func(ctx context.Context) error {
		return coordinator.Run(ctx, sys.NC, cfg, func(c *coordinator.Coordinator) { leading <- c })
	})
	var c *coordinator.Coordinator
	select {
	case c = <-leading:
	case <-time.After(waitFor):
		t.Fatal("no coordinator leads")
	}
	base := startServer(t, httpserver.Config{NC: sys.NC})
	testkit.Eventually(t, waitFor, "ready while the coordinator leads", func() bool {
		code, _ := get(t, base+"/readyz")
		return code == http.StatusOK
	})

	c.RenewedLease(time.Now().Add(-time.Hour), time.Minute) // the lease ran out by its clock
	code, body := get(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, protocol.NotServingPrefix) {
		t.Fatalf("/readyz while the leader is not serving: %d %q, want 503 with its error", code, body)
	}

	c.RenewedLease(time.Now(), time.Minute)
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz once the lease is renewed: %d %q", code, body)
	}
}

func TestServesMetricsAndDashboard(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t)
	reg := metrics.New()
	dash := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "dashboard "+r.URL.Path) })
	base := startServer(t, httpserver.Config{NC: sys.NC, Metrics: reg.Handler(), Dashboard: dash})

	if code, body := get(t, base+"/metrics"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics answered %d, %d bytes", code, len(body))
	}
	if code, body := get(t, base+"/"); code != http.StatusOK || body != "dashboard /" {
		t.Errorf("/ answered %d %q", code, body)
	}
	if code, body := get(t, base+"/api/jobs"); code != http.StatusOK || body != "dashboard /api/jobs" {
		t.Errorf("/api/jobs answered %d %q", code, body)
	}

	// Without them configured, neither is served.
	bare := startServer(t, httpserver.Config{NC: sys.NC})
	if code, _ := get(t, bare+"/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics without metrics answered %d", code)
	}
}

func TestPortInUse(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t, jobbustest.WithoutCoordinator())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = httpserver.Start(context.Background(), httpserver.Config{Listen: l.Addr().String(), NC: sys.NC})
	if !errors.Is(err, httpserver.ErrPortInUse) || !strings.Contains(err.Error(), "--http-listen") {
		t.Errorf("err = %v, want ErrPortInUse naming --http-listen", err)
	}
}

// TestLoopbackListenerRefusesOtherHosts: a page on another name that resolves to
// 127.0.0.1 (DNS rebinding) is one origin with the dashboard to the browser; the Host
// header still tells them apart.
func TestLoopbackListenerRefusesOtherHosts(t *testing.T) {
	t.Parallel()
	sys := jobbustest.Start(t, jobbustest.WithoutCoordinator())
	dash := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "dashboard") })
	base := startServer(t, httpserver.Config{NC: sys.NC, Dashboard: dash})
	port := strings.TrimPrefix(base, "http://127.0.0.1:")
	for _, tt := range []struct {
		host string
		want int
	}{
		{"127.0.0.1:" + port, http.StatusOK},
		{"localhost:" + port, http.StatusOK},
		{"[::1]:" + port, http.StatusOK},
		{"localhost", http.StatusOK},
		{"evil.example:" + port, http.StatusMisdirectedRequest},
		{"10.0.0.1:" + port, http.StatusMisdirectedRequest},
	} {
		req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
		req.Host = tt.host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("Host %s: %d, want %d", tt.host, resp.StatusCode, tt.want)
		}
	}
}
