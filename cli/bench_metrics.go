package cli

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"time"
)

// scrapeEverySecond scrapes /metrics (h) as Prometheus would, but every second
// (fifteen times as often as its default), so that bench --metrics pays for the
// scrapes too. stop ends it.
func scrapeEverySecond(h http.Handler) (stop func()) {
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
