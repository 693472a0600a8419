package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bridge"
	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/worker"
)

// startJobbus runs what `jobbus serve --workers 1` runs, in-process: an embedded NATS
// server on a free loopback port with its store in a temporary directory, a
// coordinator, one native worker, and a bridge whose TCP client port is clientAddr.
// The coordinator admits at most 4 active jobs, so that ExampleWithSubmitRetries
// meets an overload. stop undoes it all. In a program, nc comes from nats.Connect and
// clientAddr is the client port of a running `jobbus serve` (127.0.0.1:7071).
func startJobbus() (nc *nats.Conn, clientAddr string, stop func()) {
	ctx := context.Background()
	var undo []func()
	stop = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	must := func(err error) {
		if err != nil {
			stop()
			log.Fatal(err)
		}
	}
	dir, err := os.MkdirTemp("", "jobbus-example-")
	must(err)
	undo = append(undo, func() { _ = os.RemoveAll(dir) })
	srv, err := embeddednats.Start(ctx, embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(dir))
	must(err)
	undo = append(undo, func() { _ = srv.Shutdown(ctx) })
	nc, err = srv.Connect()
	must(err)
	undo = append(undo, nc.Close)

	cfg := coordinator.DefaultConfig()
	cfg.MaxActiveJobs = 4
	coord, err := coordinator.New(nc, cfg)
	must(err)
	must(coord.Start(ctx))
	undo = append(undo, func() { _ = coord.Close() })

	bcfg := bridge.DefaultConfig()
	bcfg.WorkerListen, bcfg.ClientListen = "", "127.0.0.1:0"
	br, err := bridge.New(nc, bcfg)
	must(err)
	must(br.Start(ctx))
	undo = append(undo, func() { _ = br.Close() })

	w, err := worker.New(nc, worker.WithLogger(nil))
	must(err)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(wctx) }()
	undo = append(undo, func() { cancel(); <-done; _ = w.Close() })
	return nc, br.ClientAddr().String(), stop
}

// A client on a NATS connection submits a job and waits for its result.
func ExampleNew() {
	nc, _, stop := startJobbus()
	defer stop()
	ctx := context.Background()

	c := client.New(nc)
	id, err := c.Submit(ctx, "SHA256", map[string]any{"text": "hello"})
	if err != nil {
		log.Fatal(err)
	}
	job, err := c.Wait(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(job.State, *job.Result)
	// Output: COMPLETED 2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824
}

// Submit returns once the job is durable. Options set the optional fields of the
// submission; a second submission under the same idempotency key returns the first
// job instead of creating another.
func ExampleClient_Submit() {
	nc, _, stop := startJobbus()
	defer stop()
	ctx := context.Background()

	c := client.New(nc)
	payload := map[string]any{"text": "the quick brown fox"}
	first, err := c.Submit(ctx, "WORD_COUNT", payload,
		client.Priority(protocol.PriorityHigh), client.MaxAttempts(2), client.IdempotencyKey("order-42"))
	if err != nil {
		log.Fatal(err)
	}
	again, err := c.Submit(ctx, "WORD_COUNT", payload,
		client.Priority(protocol.PriorityHigh), client.MaxAttempts(2), client.IdempotencyKey("order-42"))
	if err != nil {
		log.Fatal(err)
	}
	job, err := c.Status(ctx, first)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("same job:", first == again)
	fmt.Println(job.TaskType, job.Priority, job.MaxAttempts)
	// Output:
	// same job: true
	// WORD_COUNT HIGH 2
}

// Wait polls a job until it is COMPLETED, FAILED or CANCELLED: a job that fails
// is a result too, not an error of Wait.
func ExampleClient_Wait() {
	nc, _, stop := startJobbus()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c := client.New(nc)
	words, err := c.Submit(ctx, "WORD_COUNT", map[string]any{"text": "to be or not to be"})
	if err != nil {
		log.Fatal(err)
	}
	fails, err := c.Submit(ctx, "FAIL", map[string]any{"failUntilAttempt": 9}, client.MaxAttempts(1))
	if err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{words, fails} {
		job, err := c.Wait(ctx, id)
		if err != nil {
			log.Fatal(err)
		}
		switch job.State {
		case protocol.StateCompleted:
			fmt.Println(job.TaskType, job.State, *job.Result)
		default:
			fmt.Println(job.TaskType, job.State, *job.Error)
		}
	}
	// Output:
	// WORD_COUNT COMPLETED 6
	// FAIL FAILED deliberate failure on attempt 1 (failing until 9) (all 1 attempts used)
}

// Cancel reports whether this call cancelled the job: cancelling it again changes
// nothing.
func ExampleClient_Cancel() {
	nc, _, stop := startJobbus()
	defer stop()
	ctx := context.Background()

	c := client.New(nc)
	id, err := c.Submit(ctx, "SLEEP", map[string]any{"durationMillis": 60_000})
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		cancelled, job, err := c.Cancel(ctx, id)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(cancelled, job.State)
	}
	// Output:
	// true CANCELLED
	// false CANCELLED
}

// List returns jobs newest first, a page at a time, optionally of one state.
func ExampleClient_List() {
	nc, _, stop := startJobbus()
	defer stop()
	ctx := context.Background()

	c := client.New(nc)
	for _, limit := range []int{10, 100, 1000} {
		id, err := c.Submit(ctx, "PRIME_COUNT", map[string]any{"limit": limit})
		if err != nil {
			log.Fatal(err)
		}
		if _, err := c.Wait(ctx, id); err != nil {
			log.Fatal(err)
		}
	}
	completed := protocol.StateCompleted
	req := protocol.ListJobs{State: &completed, Limit: 2}
	for {
		page, err := c.List(ctx, req)
		if err != nil {
			log.Fatal(err)
		}
		for _, job := range page.Jobs {
			fmt.Println(job.TaskType, *job.Result)
		}
		if page.NextCursor == "" {
			break
		}
		req.Cursor = page.NextCursor
	}
	// Output:
	// PRIME_COUNT 168
	// PRIME_COUNT 25
	// PRIME_COUNT 4
}

// DialTCP speaks PROTOCOL.md's framed TCP to the client port of `jobbus serve` or
// `jobbus bridge`, for clients away from NATS; the client works as over NATS.
func ExampleDialTCP() {
	_, clientAddr, stop := startJobbus()
	defer stop()
	ctx := context.Background()

	c, err := client.DialTCP(ctx, clientAddr) // e.g. "127.0.0.1:7071"
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	id, err := c.Submit(ctx, "SHA256", map[string]any{"text": ""})
	if err != nil {
		log.Fatal(err)
	}
	job, err := c.Wait(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(job.State, *job.Result)
	// Output: COMPLETED e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
}

// With submit retries a client rides out an overloaded coordinator: here 12
// submitters share a coordinator that admits 4 active jobs at a time, and every
// submission gets in. A client that gives up returns an error for which
// errors.Is(err, client.ErrRejected) holds.
func ExampleWithSubmitRetries() {
	nc, _, stop := startJobbus()
	defer stop()
	ctx := context.Background()

	c := client.New(nc, client.WithSubmitRetries(1000, 5*time.Millisecond, 50*time.Millisecond))
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for range 12 {
		wg.Go(func() {
			id, err := c.Submit(ctx, "SLEEP", map[string]any{"durationMillis": 20})
			if err == nil {
				_, err = c.Wait(ctx, id)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	rejected, failed := 0, 0
	for err := range errs {
		switch {
		case errors.Is(err, client.ErrRejected):
			rejected++
		case err != nil:
			failed++
		}
	}
	fmt.Println("rejected:", rejected, "failed:", failed)
	// Output: rejected: 0 failed: 0
}

// Watch reports jobs as they change: natively from the coordinator's job records in
// JetStream KV, over DialTCP by polling the job list.
func ExampleClient_Watch() {
	nc, _, stop := startJobbus()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	c := client.New(nc)
	events, err := c.Watch(ctx)
	if err != nil {
		log.Fatal(err)
	}
	id, err := c.Submit(ctx, "WORD_COUNT", map[string]any{"text": "to be or not to be"})
	if err != nil {
		log.Fatal(err)
	}
	for ev := range events {
		if ev.Err != nil {
			log.Fatal(ev.Err)
		}
		if ev.Job.JobID == id && ev.Job.State.Terminal() {
			fmt.Println(ev.Type, ev.Job.State, *ev.Job.Result)
			break
		}
	}
	// Output: changed COMPLETED 6
}

// SubmitMany submits several jobs in one request; each result is its own
// submission's job, or the error Submit would have returned for it alone.
func ExampleClient_SubmitMany() {
	nc, _, stop := startJobbus()
	defer stop()
	ctx := context.Background()

	c := client.New(nc)
	res, err := c.SubmitMany(ctx, []client.Submission{
		{TaskType: "WORD_COUNT", Payload: map[string]any{"text": "one"}},
		{TaskType: "NO_SUCH_TYPE!", Payload: map[string]any{"text": "x"}},
		{TaskType: "WORD_COUNT", Payload: map[string]any{"text": "one two three"}, Options: []client.SubmitOption{client.MaxAttempts(2)}},
	})
	if err != nil {
		log.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil {
			fmt.Println(i, "not submitted:", errors.Is(r.Err, client.ErrServer))
			continue
		}
		job, err := c.Wait(ctx, r.JobID)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(i, job.State, *job.Result)
	}
	// Output:
	// 0 COMPLETED 1
	// 1 not submitted: true
	// 2 COMPLETED 3
}
