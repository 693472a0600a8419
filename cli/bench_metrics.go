package cli

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/jobbus/jobbus/internal/metrics"
)

// scrapeEverySecond scrapes reg's /metrics as Prometheus would, but every second
// (fifteen times as often as its default), so that bench --metrics pays for the
// scrapes too. stop ends it.
func scrapeEverySecond(reg *metrics.Registry) (stop func()) {
	h := reg.Handler()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/metrics", nil))
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
