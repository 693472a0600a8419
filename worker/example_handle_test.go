package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/worker"
	"github.com/jobbus/jobbus/worker/tasks"
)

// TextReverse is the payload of the task type TEXT_REVERSE: the struct's tags make the
// JSON Schema the worker declares ("text" is required, at most 10,000 characters).
type TextReverse struct {
	Text string `json:"text" jsonschema:"maxLength=10000"`
}

// A worker serving a task type of its own. The coordinator validates every submission
// against the declared schema before the job exists, and assigns TEXT_REVERSE jobs only
// to workers that serve it.
func ExampleHandleJSON() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url, stop := startJobbus(ctx) // in a program: the NATS URL of `jobbus serve`
	defer stop()

	w, err := worker.Connect(ctx, url, worker.WithTasks(tasks.NewRegistry()), worker.WithLogger(nil))
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()
	err = worker.HandleJSON(w, "TEXT_REVERSE", func(_ context.Context, _ int, a TextReverse) (string, error) {
		r := []rune(a.Text)
		slices.Reverse(r)
		return string(r), nil
	}, worker.MaxAttempts(2), worker.Concurrency(8))
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() { stopWorker(); <-done }()

	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c := client.New(nc)
	var id string
	for id == "" { // until the worker's registration has declared the type
		if id, err = c.Submit(ctx, "TEXT_REVERSE", TextReverse{Text: "hello, jobbus"}); err != nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
	job, err := c.Wait(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(job.State, *job.Result, job.MaxAttempts)

	_, err = c.Submit(ctx, "TEXT_REVERSE", map[string]any{"text": 42})
	var se *client.ServerError
	fmt.Println(errors.As(err, &se), se.Message)
	// Output:
	// COMPLETED subboj ,olleh 2
	// true Invalid payload: at '/text': got number, want string
}

// startJobbus starts an embedded NATS server on a free loopback port, its store in
// a temporary directory, and a coordinator on it; it returns the server's URL.
func startJobbus(ctx context.Context) (url string, stop func()) {
	dir, err := os.MkdirTemp("", "jobbus-example-")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := embeddednats.Start(ctx, embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(dir))
	if err != nil {
		log.Fatal(err)
	}
	nc, err := srv.Connect()
	if err != nil {
		log.Fatal(err)
	}
	coord, err := coordinator.New(nc, coordinator.DefaultConfig())
	if err == nil {
		err = coord.Start(ctx)
	}
	if err != nil {
		log.Fatal(err)
	}
	return srv.ClientURL(), func() {
		_ = coord.Close()
		nc.Close()
		_ = srv.Shutdown(context.Background())
		_ = os.RemoveAll(dir)
	}
}
