package reuse_test

import (
	"bytes"
	"runtime"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/jobbus/jobbus/internal/reuse"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// goroutineID reads the calling goroutine's number from its stack header.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return string(bytes.Fields(buf)[1])
}

// TestPoolReusesAndStops: every function runs; functions run one after the other
// share goroutines (200 calls, far fewer goroutines); closing quit ends the idle
// goroutines, and the wait group sees them gone.
func TestPoolReusesAndStops(t *testing.T) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	p := reuse.New(quit, &wg)
	const n = 200
	ran := map[string]int{} // goroutine: functions it ran
	var mu sync.Mutex
	for range n {
		done := make(chan struct{})
		p.Go(func() {
			mu.Lock()
			ran[goroutineID()]++
			mu.Unlock()
			close(done)
		})
		<-done
	}
	total := 0
	for _, k := range ran {
		total += k
	}
	if total != n {
		t.Fatalf("%d of %d functions ran", total, n)
	}
	if len(ran) > n/2 {
		t.Errorf("%d goroutines for %d functions run one after the other: not reused", len(ran), n)
	}
	close(quit)
	wg.Wait() // returns only once every goroutine of the pool has exited
}

// BenchmarkPoolHandoff is a function handed to a pooled goroutine and waited for, as
// a worker's attempt is: the pool's part should be a channel send.
func BenchmarkPoolHandoff(b *testing.B) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	p := reuse.New(quit, &wg)
	done := make(chan struct{})
	fn := func() { done <- struct{}{} }
	for b.Loop() {
		p.Go(fn)
		<-done
	}
	close(quit)
	wg.Wait()
}
