package coordinator_test

import (
	"context"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestMeasureNATSMessageSchedules (JOBBUS_MEASURE=1, `task measure-timers`) measures
// what holding jobbus's due times in nats-server (ADR-51 message scheduling,
// `Nats-Schedule: @at ...`) would cost: N scheduled messages, one subject each (the
// server keeps one schedule per subject), due over a window, each delivered to a target
// subject that a consumer reads, as a coordinator would to learn that a job is due. It
// logs the publish rate, the server's heap and store per message, and the lateness of
// each delivery against its due time. The coordinator's own timers are measured by
// `jobbus bench --scheduled`; the design note compares the two.
func TestMeasureNATSMessageSchedules(t *testing.T) {
	if os.Getenv("JOBBUS_MEASURE") == "" {
		t.Skip("measurement: set JOBBUS_MEASURE=1 (task measure-timers)")
	}
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("JOBBUS_MEASURE_N")); err == nil && v > 0 {
		n = v
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SCHED", Subjects: []string{"sched.>", "due.>"},
		Storage: jetstream.FileStorage, AllowMsgSchedules: true, AllowMsgTTL: true})
	if err != nil {
		t.Fatal(err)
	}
	heap0 := heapInUse()

	// Due times: from lead after the last publish, spread evenly over window.
	const lead, window = 3 * time.Second, 10 * time.Second
	due := make([]time.Time, n)
	// The first due time leaves publishing (about 20 µs a message here) lead to spare.
	start := time.Now()
	firstDue := start.Add(lead + time.Duration(n)*20*time.Microsecond)
	for i := range due {
		due[i] = firstDue.Add(window * time.Duration(i) / time.Duration(n))
	}
	for i := range n {
		m := nats.NewMsg("sched." + strconv.Itoa(i))
		m.Header.Set("Nats-Schedule", "@at "+due[i].UTC().Format(time.RFC3339Nano))
		m.Header.Set("Nats-Schedule-Target", "due."+strconv.Itoa(i))
		m.Data = []byte(`{"jobId":"` + strconv.Itoa(i) + `"}`)
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishes not acknowledged")
	}
	published := time.Since(start)
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	heap1 := heapInUse()
	if late := time.Since(firstDue); late > 0 {
		t.Logf("warning: publishing ended %v after the first due time", late)
	}

	// Read the deliveries on due.> as they come.
	late := make([]time.Duration, 0, n)
	var got atomic.Int64
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"due.>"}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		now := time.Now()
		i, _ := strconv.Atoi(msg.Subject()[len("due."):])
		late = append(late, now.Sub(due[i]))
		if got.Add(1) == int64(n) {
			close(done)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	select {
	case <-done:
	case <-time.After(time.Until(due[n-1]) + time.Minute):
		t.Fatalf("only %d of %d scheduled messages delivered", got.Load(), n)
	}
	slices.Sort(late)
	pct := func(p float64) time.Duration {
		return late[min(len(late)-1, int(p*float64(len(late))))].Round(time.Millisecond)
	}
	t.Logf("nats-server %s, %d @at messages (one subject each) due over %v: publish %v (%.0f msg/s), store %d bytes (%d per message), server heap +%d MiB (%d bytes per message)",
		server.VERSION, n, window, published.Round(time.Millisecond), float64(n)/published.Seconds(),
		info.State.Bytes, info.State.Bytes/uint64(n), (heap1-heap0)>>20, (heap1-heap0)/uint64(n))
	t.Logf("lateness of delivery to a consumer vs due time: p50 %v p99 %v max %v (min %v)", pct(0.5), pct(0.99), late[len(late)-1].Round(time.Millisecond), late[0].Round(time.Millisecond))
}

// heapInUse is the process's live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
