// Command functions is a jobbus worker that serves a task type of its own, TEXT_REVERSE:
// its payload is {"text": string} (required, at most 10,000 characters), its result the
// text reversed by Unicode code point. The worker declares the type with a JSON Schema
// derived from TextReverse when it registers; the coordinator keeps it in its catalogue,
// rejects bad payloads before a job exists, and sends TEXT_REVERSE jobs to this worker
// only.
//
//	go run . serve                                    # terminal 1: the system
//	go run ./examples/functions --nats nats://127.0.0.1:4222   # terminal 2: this worker
//	jobbus submit TEXT_REVERSE --payload '{"text":"hello, jobbus"}' --wait
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tasks"
)

// TextReverse is TEXT_REVERSE's payload; its tags make the schema the worker declares.
type TextReverse struct {
	Text string `json:"text" jsonschema:"maxLength=10000"`
}

// reverse reverses the text by code point.
func reverse(_ context.Context, _ int, args TextReverse) (string, error) {
	r := []rune(args.Text)
	slices.Reverse(r)
	return string(r), nil
}

func main() {
	url := flag.String("nats", "nats://127.0.0.1:4222", "NATS URL of the jobbus system")
	capacity := flag.Int("capacity", 4, "jobs to run at once")
	flag.Parse()
	// A write to a closed pipe (`... 2>&1 | tee worker.log`, then Ctrl-C, ends tee
	// first) fails instead of killing the worker in the middle of its drain.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *url, *capacity); err != nil {
		fmt.Fprintln(os.Stderr, "functions:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url string, capacity int) error {
	w, err := worker.Connect(ctx, url, worker.WithCapacity(capacity),
		worker.WithTasks(tasks.NewRegistry()), // TEXT_REVERSE only, not the built-ins
		worker.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	if err != nil {
		return err
	}
	defer w.Close()
	if err := worker.HandleJSON(w, "TEXT_REVERSE", reverse, worker.MaxAttempts(2)); err != nil {
		return err
	}
	// Ctrl-C drains: no new jobs, and the running ones finish (for up to 10 s) before
	// Run stops, so that stopping the worker costs them no attempt.
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	ran := make(chan struct{})
	defer close(ran)
	go func() {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = w.Drain(dctx)
			stopRun()
		case <-ran:
		}
	}()
	return w.Run(runCtx)
}
