package coordinator_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest/suite"
	"github.com/jobbus/jobbus/internal/testkit"
	"github.com/jobbus/jobbus/worker"
)

// campaigners starts coordinators that campaign for the lead over s's connection with
// cfg: run(n) starts the nth (stop ends it, and the test's cleanup does too), leads(n)
// says how often it took the lead.
func campaigners(t *testing.T, s *system, cfg coordinator.Config) (run func(n int) (stop func()), leads func(n int) int) {
	var mu sync.Mutex
	led := map[int]int{}
	run = func(n int) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := coordinator.Run(ctx, s.NC, cfg, func(*coordinator.Coordinator) {
				mu.Lock()
				led[n]++
				mu.Unlock()
			}); err != nil {
				t.Error(err)
			}
		}()
		var once sync.Once
		stop = func() { once.Do(func() { cancel(); <-done }) }
		t.Cleanup(stop)
		return stop
	}
	leads = func(n int) int { mu.Lock(); defer mu.Unlock(); return led[n] }
	return run, leads
}

// TestStandbyTakesOver runs two campaigning coordinators: one leads, the other waits,
// and takes over with the jobs when the leader stops.
func TestStandbyTakesOver(t *testing.T) {
	t.Parallel()
	s := setup(t)
	_ = s.Coordinator.Close() // the campaigners below replace the plain coordinator

	cfg := s.Config
	cfg.LeaderLease = 600 * time.Millisecond
	run, leads := campaigners(t, s, cfg)
	led := func() (a, b int) { return leads(1), leads(2) }
	stop1 := run(1)
	s.Eventually("coordinator 1 leads", func() bool { a, _ := led(); return a == 1 })
	run(2)
	id := s.Submit("SHA256", text("before failover"))
	time.Sleep(2 * cfg.LeaderLease) // the standby must keep standing by while the leader renews
	if a, b := led(); a != 1 || b != 0 {
		t.Fatalf("leadership while 1 is alive: %d, %d", a, b)
	}
	stop1()
	s.Eventually("coordinator 2 leads", func() bool { _, b := led(); return b == 1 })
	s.StartWorker(2)
	if j := s.Wait(id); j.State != protocol.StateCompleted {
		t.Fatalf("job submitted to the old leader: %+v", j)
	}
}

// TestLeaseOfACrashedLeaderExpires: a leader that stops renewing without giving its
// lease up (a crash) blocks the standby for at most the lease, not forever.
func TestLeaseOfACrashedLeaderExpires(t *testing.T) {
	t.Parallel()
	s := setup(t)
	_ = s.Coordinator.Close()
	cfg := s.Config
	cfg.LeaderLease = 500 * time.Millisecond

	// The crashed leader: its lease entry, never renewed.
	js, err := jetstream.New(s.NC)
	must(t, err)
	kv, err := js.CreateOrUpdateKeyValue(context.Background(), jetstream.KeyValueConfig{
		Bucket: protocol.LeaderBucket, History: 1, TTL: cfg.LeaderLease, Storage: jetstream.FileStorage,
	})
	must(t, err)
	_, err = kv.Create(context.Background(), "coordinator", []byte("crashed"))
	must(t, err)
	crashedAt := time.Now()

	ctx, cancel := context.WithCancel(context.Background())
	led := make(chan time.Time, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = coordinator.Run(ctx, s.NC, cfg, func(*coordinator.Coordinator) { led <- time.Now() })
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case at := <-led:
		if waited := at.Sub(crashedAt); waited < cfg.LeaderLease/2 {
			t.Fatalf("took over after %v, while the crashed leader's lease (%v) was still valid", waited, cfg.LeaderLease)
		}
	case <-time.After(20 * cfg.LeaderLease):
		t.Fatal("the standby never took over from a crashed leader")
	}
	id := s.Submit("SHA256", text("after the crash"))
	s.StartWorker(1)
	if j := s.Wait(id); j.State != protocol.StateCompleted {
		t.Fatalf("job %+v", j)
	}
}

// TestFencedLeaderStepsDown: a leader fenced by a foreign write gives its lease up, and
// the coordinator that leads next serves the stored state, the foreign write included.
func TestFencedLeaderStepsDown(t *testing.T) {
	t.Parallel()
	s := setup(t)
	_ = s.Coordinator.Close()
	cfg := s.Config
	cfg.LeaderLease = time.Hour // only stepping down can hand the lease on in time
	ctx := context.Background()
	leaders := campaign(t, s, cfg)
	first := recv(t, "the first leader", leaders)

	m := s.ManualWorker("w", 1)
	id := s.Submit("SHA256", text("x"))
	a := s.NextAssign(m)
	cancelBehindItsBack(t, s, id)
	// Its write of the result fails the CAS: the leader is fenced.
	_, _ = bus.Ask[protocol.ResultAck](ctx, m.(*suite.BusPeer).Node(), coordinatorAddr, protocol.PathResult, suite.Result("w", a, true, "mine"))

	recv(t, "the leader fenced", first.Fenced())
	if next := recv(t, "a new leader", leaders); next == first {
		t.Fatal("the fenced coordinator leads again")
	}
	s.Eventually("the stored state served", func() bool {
		j, err := s.Client.Status(ctx, id)
		return err == nil && j.State == protocol.StateCancelled
	})
}

// TestLeaderRidesOutAMissedRenewal: failed renewals of the lease do not cost the
// leadership (and with it a recovery that counts an attempt of every running job)
// unless another coordinator takes the lease; while the lease may have run out the
// leader answers nothing.
func TestLeaderRidesOutAMissedRenewal(t *testing.T) {
	t.Parallel()
	s, logs, leaders := leading(t)
	ctx := context.Background()

	// Renewals fail while the lease bucket takes no message of a lease's size: a
	// real JetStream error that is not a lost lease.
	js, err := jetstream.New(s.NC)
	must(t, err)
	stream, err := js.Stream(ctx, "KV_"+protocol.LeaderBucket)
	must(t, err)
	limit := func(size int32) {
		conf := stream.CachedInfo().Config
		conf.MaxMsgSize = size
		_, err := js.UpdateStream(ctx, conf)
		must(t, err)
	}
	limit(1)
	// Retried ("lease renewal failed; retrying") or, before this rule, given up ("renew lease: ...").
	s.Eventually("a renewal failed", func() bool { return strings.Contains(logs.String(), "renew") })
	limit(-1)
	kv, err := js.KeyValue(ctx, protocol.LeaderBucket)
	must(t, err)
	before, err := kv.Get(ctx, "coordinator")
	must(t, err)
	s.Eventually("the lease renewed again", func() bool {
		e, err := kv.Get(ctx, "coordinator")
		return err == nil && e.Revision() > before.Revision()
	})
	select {
	case <-leaders:
		t.Fatalf("leadership changed over one missed renewal:\n%s", logs.String())
	default:
	}
	if strings.Contains(logs.String(), "lost leadership") {
		t.Fatalf("leadership given up over one missed renewal:\n%s", logs.String())
	}

	// Failing for longer than a lease: the leader answers nothing meanwhile (another
	// could have taken over, for all it knows), and serves again, still leading, once
	// a renewal gets through, since nobody took the lease.
	limit(1)
	s.Eventually("requests refused while the lease may have run out", func() bool {
		_, err := s.Client.Status(ctx, "no-such-job")
		return err != nil && strings.Contains(err.Error(), "lease may have run out")
	})
	limit(-1)
	s.Eventually("requests answered again", func() bool {
		_, err := s.Client.Status(ctx, "no-such-job")
		return err != nil && strings.Contains(err.Error(), "Unknown job")
	})
	select {
	case <-leaders:
		t.Fatalf("leadership changed over an outage nobody else used:\n%s", logs.String())
	default:
	}
}

// TestLeaderKeepsALeaseWhoseRenewalAckWasLost: a renewal stored but not acknowledged
// leaves the leader one revision behind its own lease. The lease is still its own, so
// it keeps leading, where a lease taken by another would make it step down.
func TestLeaderKeepsALeaseWhoseRenewalAckWasLost(t *testing.T) {
	t.Parallel()
	s, logs, leaders := leading(t)
	ctx := context.Background()

	js, err := jetstream.New(s.NC)
	must(t, err)
	kv, err := js.KeyValue(ctx, protocol.LeaderBucket)
	must(t, err)
	e, err := kv.Get(ctx, "coordinator")
	must(t, err)
	leader := string(e.Value())
	lost, err := kv.Put(ctx, "coordinator", e.Value()) // the renewal whose ack never came
	must(t, err)
	s.Eventually("the lease renewed past the lost renewal", func() bool {
		e, err := kv.Get(ctx, "coordinator")
		return err == nil && e.Revision() > lost && string(e.Value()) == leader
	})
	if strings.Contains(logs.String(), "lost leadership") || len(leaders) > 0 {
		t.Fatalf("leadership changed over its own renewal:\n%s", logs.String())
	}

	// A lease that names another coordinator is lost at once.
	_, err = kv.Put(ctx, "coordinator", []byte("someone-else"))
	must(t, err)
	s.Eventually("leadership given up", func() bool { return strings.Contains(logs.String(), "lease lost to another coordinator") })
}

// leading starts a campaigning coordinator with a 3 s lease (renewed every second: slow
// enough for a loaded machine), logging into logs, and waits until it leads.
func leading(t *testing.T) (s *system, logs *testkit.Buffer, leaders <-chan *coordinator.Coordinator) {
	s = setup(t)
	_ = s.Coordinator.Close()
	cfg := s.Config
	cfg.LeaderLease = 3 * time.Second
	logs = new(testkit.Buffer)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	leaders = campaign(t, s, cfg)
	recv(t, "the first leader", leaders)
	return s, logs, leaders
}

// campaign runs coordinator.Run with cfg until the test ends, and returns the
// coordinators it leads with, in turn.
func campaign(t *testing.T, s *system, cfg coordinator.Config) <-chan *coordinator.Coordinator {
	leaders, _ := stoppableCampaign(t, s, cfg)
	return leaders
}

// recv waits for a value from ch, failing the test after a while.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(15 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// TestRestartedLeaderTakesItsLeaseBack: a coordinator that finds the lease under its own
// ID (it crashed and came back) leads at once instead of waiting the lease out, while a
// lease under another ID is still respected.
func TestRestartedLeaderTakesItsLeaseBack(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, holder string
		leadsAtOnce  bool
	}{
		{"OwnLease", "coordinator-a", true},
		{"ForeignLease", "coordinator-b", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t)
			_ = s.Coordinator.Close()
			cfg := s.Config
			cfg.ID = "coordinator-a"
			cfg.LeaderLease = time.Hour // only taking the lease back can lead in time

			// The crashed process's lease, never renewed.
			js, err := jetstream.New(s.NC)
			must(t, err)
			kv, err := js.CreateOrUpdateKeyValue(context.Background(), jetstream.KeyValueConfig{
				Bucket: protocol.LeaderBucket, History: 1, TTL: cfg.LeaderLease, Storage: jetstream.FileStorage,
			})
			must(t, err)
			_, err = kv.Create(context.Background(), "coordinator", []byte(tt.holder))
			must(t, err)

			ctx, cancel := context.WithCancel(context.Background())
			led := make(chan struct{}, 1)
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = coordinator.Run(ctx, s.NC, cfg, func(*coordinator.Coordinator) { led <- struct{}{} })
			}()
			t.Cleanup(func() { cancel(); <-done })
			if !tt.leadsAtOnce {
				select {
				case <-led:
					t.Fatal("took over a lease held by another coordinator")
				case <-time.After(time.Second):
				}
				return
			}
			select {
			case <-led:
			case <-time.After(15 * time.Second):
				t.Fatal("a restarted coordinator did not take its own lease back")
			}
			id := s.Submit("SHA256", text("after the restart"))
			s.StartWorker(1)
			if j := s.Wait(id); j.State != protocol.StateCompleted {
				t.Fatalf("job %+v", j)
			}
		})
	}
}

// TestWorkersFollowANewLeaderAtOnce: a new leader announces itself, and workers
// register with it then, not at their next heartbeat (here far beyond the test's
// patience), so that jobs run again within moments of a failover.
func TestWorkersFollowANewLeaderAtOnce(t *testing.T) {
	t.Parallel()
	s := setup(t)
	_ = s.Coordinator.Close()
	cfg := s.Config
	cfg.LeaderLease = 600 * time.Millisecond
	cfg.HeartbeatTimeout = time.Hour
	first, stopFirst := stoppableCampaign(t, s, cfg)
	c1 := recv(t, "the first leader", first)
	s.StartNativeWorker(t, worker.WithCapacity(1), worker.WithHeartbeat(time.Hour))
	s.Eventually("the worker registered", func() bool { return len(c1.Stats().Workers) == 1 })
	second, _ := stoppableCampaign(t, s, cfg)

	stopFirst()
	c2 := recv(t, "the standby leading", second)
	if c2.Term() <= c1.Term() {
		t.Fatalf("terms %d then %d", c1.Term(), c2.Term())
	}
	id := s.Submit("SHA256", text("after failover"))
	if j := s.Wait(id); j.State != protocol.StateCompleted {
		t.Fatalf("job %+v", j)
	}
}

// stoppableCampaign is campaign with a stop of its own, also called when the test ends.
func stoppableCampaign(t *testing.T, s *system, cfg coordinator.Config) (<-chan *coordinator.Coordinator, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	leaders := make(chan *coordinator.Coordinator, 4)
	done := make(chan error, 1)
	go func() { done <- coordinator.Run(ctx, s.NC, cfg, func(c *coordinator.Coordinator) { leaders <- c }) }()
	stop := sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return leaders, stop
}

// TestCoordinatorWithAnotherLeaseIsRefused: a coordinator started with another
// --leader-lease-millis than the bucket's is refused at once, and the leader's lease
// is left as it is. Before, it rewrote the bucket's TTL: a leader with a longer lease
// then renewed less often than its lease lasted, and lost it between renewals.
func TestCoordinatorWithAnotherLeaseIsRefused(t *testing.T) {
	t.Parallel()
	s, logs, leaders := leading(t) // a 3 s lease
	cfg := s.Config
	cfg.LeaderLease = 600 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := coordinator.Run(ctx, s.NC, cfg, nil)
	if !errors.Is(err, coordinator.ErrLeaseDiffers) || ctx.Err() != nil {
		t.Fatalf("Run with another lease = %v, want %v at once", err, coordinator.ErrLeaseDiffers)
	}
	for _, want := range []string{"3s", "600ms", "--leader-lease-millis 3000", "--reconfigure-buckets"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	js, err := jetstream.New(s.NC)
	must(t, err)
	stream, err := js.Stream(ctx, "KV_"+protocol.LeaderBucket)
	must(t, err)
	if got := stream.CachedInfo().Config.MaxAge; got != 3*time.Second {
		t.Fatalf("lease bucket TTL = %v after the refusal, want 3s", got)
	}
	time.Sleep(2 * time.Second) // two renewals: the leader must keep its lease
	if len(leaders) > 0 || strings.Contains(logs.String(), "lost leadership") {
		t.Fatalf("leadership changed:\n%s", logs.String())
	}
}
