package cli_test

import (
	"context"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/testkit"
)

// TestPausedCoordinatorDoesNotBlackHoleReads: a leading coordinator is frozen
// (SIGSTOP) with its queue subscriptions in place. With ping settings like serve's, the
// server drops it within a few pings; meanwhile every status read, natively and through
// the bridge, is answered: a read that reached the frozen one is sent again and reaches
// the standby that took over.
func TestPausedCoordinatorDoesNotBlackHoleReads(t *testing.T) {
	t.Parallel()
	// Short in CI; the long run (JOBBUS_LONG_TESTS=1) measures serve's own settings.
	ping, maxOut := 300*time.Millisecond, 2
	if os.Getenv("JOBBUS_LONG_TESTS") != "" {
		ping, maxOut = embeddednats.PingInterval, embeddednats.MaxPingsOut
	}
	srv, err := embeddednats.Start(context.Background(), embeddednats.WithListen("127.0.0.1:-1"),
		embeddednats.WithStoreDir(t.TempDir()), embeddednats.WithPing(ping, maxOut))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	url := srv.ClientURL()
	// serving lists the connections subscribed to the status endpoint: the leading
	// coordinator's (a coordinator serves on a connection of its own per term).
	serving := func() []uint64 {
		cz, err := srv.NATS().Connz(&server.ConnzOptions{Subscriptions: true})
		if err != nil {
			return nil
		}
		var cids []uint64
		for _, c := range cz.Conns {
			if slices.Contains(c.Subs, "jobbus.api.status") {
				cids = append(cids, c.Cid)
			}
		}
		return cids
	}

	args := []string{"--nats", url, "coordinator", "--leader-lease-millis", "2000"}
	a := startProc(t, nil, args...)
	a.logged("coordinator serving")
	b := startProc(t, nil, args...)
	b.logged("standing by")
	var frozen uint64
	eventually(t, "one coordinator serving", func() bool {
		cids := serving()
		if len(cids) == 1 {
			frozen = cids[0]
		}
		return len(cids) == 1
	})

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	native := client.New(nc, client.WithTimeout(15*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := native.Submit(ctx, "SLEEP", map[string]int{"durationMillis": 1}) // no worker: it stays QUEUED
	if err != nil {
		t.Fatal(err)
	}
	br, err := bridge.New(nc, bridgeConfigOn(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = br.Close() })
	tcp, err := client.DialTCP(ctx, br.ClientAddr().String(), client.WithTimeout(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tcp.Close() })

	// Readers over both transports, from before the pause until after the failover.
	var reads, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, cl := range []*client.Client{native, native, tcp} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := cl.Status(context.Background(), id); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
				reads.Add(1)
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	paused := time.Now()
	a.signal(syscall.SIGSTOP)
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	var dropped, took time.Duration // from the pause: the server dropped it; the standby serves
	testkit.Eventually(t, 30*time.Second, "the server to drop the frozen coordinator and the standby to serve", func() bool {
		if dropped == 0 && !slices.Contains(serving(), frozen) {
			dropped = time.Since(paused)
		}
		if took == 0 && strings.Contains(b.stderr.String(), "coordinator serving") {
			took = time.Since(paused)
		}
		return dropped > 0 && took > 0
	})
	before := reads.Load()
	testkit.Eventually(t, 30*time.Second, "reads after the failover", func() bool { return reads.Load() > before+10 })
	close(stop)
	wg.Wait()
	t.Logf("ping %v x %d: frozen coordinator dropped after %v; standby serving after %v; %d reads, %d failed",
		ping, maxOut, dropped.Round(time.Millisecond), took.Round(time.Millisecond), reads.Load(), failed.Load())
	if failed.Load() > 0 {
		t.Fatalf("%d of %d reads failed while the leader was frozen; first: %v", failed.Load(), reads.Load(), firstErr.Load())
	}
}

// bridgeConfigOn is a bridge with the client port on a free loopback port.
func bridgeConfigOn(requestTimeout time.Duration) bridge.Config {
	cfg := bridge.DefaultConfig()
	cfg.WorkerListen = ""
	cfg.ClientListen = net.JoinHostPort("127.0.0.1", "0")
	cfg.RequestTimeout = requestTimeout
	return cfg
}
