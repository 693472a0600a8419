// Command fillstore fills a jobbus store with finished jobs, written straight to
// JetStream as the coordinator writes them (its own messages: coordinator.RecordMessage), so that memory and restart
// time can be measured at 200,000 or 1,000,000 retained jobs without running them all:
//
//	go run ./internal/cmd/fillstore --data-dir /tmp/store --jobs 1000000
//	jobbus serve --data-dir /tmp/store   # then measure time to serving, and RSS
//
// With --scheduled-in it writes SCHEDULED jobs instead, due that far ahead (spread over
// a day after it), as delayed submissions leave them: a million far-future jobs.
//
// A store it filled is an ordinary store: serve it, list it, let it expire.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/system"
)

func main() {
	dir := flag.String("data-dir", "data", "the store to fill (serve's --data-dir)")
	jobs := flag.Int("jobs", 200_000, "finished jobs to write")
	retention := flag.Duration("retention", 24*time.Hour, "the TTL the records get (serve's --retention)")
	scheduledIn := flag.Duration("scheduled-in", 0, "write SCHEDULED jobs due this far ahead (and over a day after) instead of finished ones")
	flag.Parse()
	if err := fill(*dir, *jobs, *retention, *scheduledIn); err != nil {
		log.Fatal(err)
	}
}

func fill(dir string, n int, retention, scheduledIn time.Duration) error {
	ctx := context.Background()
	// A coordinator creates the buckets as serve's would (system.Start, with its
	// election), and is gone before the writes.
	server := []embeddednats.Option{embeddednats.WithListen("127.0.0.1:-1")}
	cfg := coordinator.DefaultConfig()
	cfg.Logger = slog.New(slog.DiscardHandler)
	sys, err := system.Start(ctx, system.Config{NATS: system.NATS{Server: server, StoreDir: dir}, Coordinator: &cfg})
	if err != nil {
		return err
	}
	if _, err := sys.Leading(ctx); err != nil {
		_ = sys.Close()
		return err
	}
	if err := sys.Close(); err != nil {
		return err
	}
	sys, err = system.Start(ctx, system.Config{NATS: system.NATS{Server: server, StoreDir: dir}})
	if err != nil {
		return err
	}
	defer func() { _ = sys.Close() }()
	nc := sys.Conn()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return err
	}
	start := time.Now()
	result := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for i := range n {
		now := time.Now().UnixMilli()
		r := protocol.Record{
			JobID: fmt.Sprintf("filled-%08d", i), TaskType: "SHA256", Payload: json.RawMessage(`{"text":"filled"}`),
			State: protocol.StateCompleted, Attempts: 1, MaxAttempts: 3, Priority: protocol.PriorityNormal,
			Seq: uint64(i + 1), Result: &result, CreatedAt: now, UpdatedAt: now, EndedAt: now,
		}
		if scheduledIn > 0 {
			r.State, r.Attempts, r.Result, r.EndedAt = protocol.StateScheduled, 0, nil, 0
			r.RunAt = now + (scheduledIn + 24*time.Hour*time.Duration(i)/time.Duration(n)).Milliseconds()
		}
		// The coordinator's own message for the record, headers and TTL included: a
		// header missing would make recovery take the record for an older release's.
		msg, err := coordinator.RecordMessage(&r, retention)
		if err != nil {
			return err
		}
		// A loaded machine can keep 4,096 writes unacknowledged for longer than the
		// default 200 ms stall.
		opts := []jetstream.PublishOpt{jetstream.WithStallWait(time.Minute)}
		if _, err := js.PublishMsgAsync(msg, opts...); err != nil {
			return err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		return fmt.Errorf("writes not acknowledged")
	}
	what := "finished"
	if scheduledIn > 0 {
		what = "SCHEDULED"
	}
	fmt.Fprintf(os.Stderr, "wrote %d %s jobs to %s in %v\n", n, what, dir, time.Since(start).Round(time.Millisecond))
	return nil
}
