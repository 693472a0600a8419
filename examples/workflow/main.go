// Command workflow submits a workflow and a batch to a running jobbus system, runs the
// worker that serves them, and prints how they ended. The workflow counts the words
// of three texts in parallel (a fan-out of WORD_COUNT steps after a first step) and
// sums them in a last step that reads its parents' results (worker.ParentResults).
// The batch hashes three texts, with a callback once all completed (onSuccess) and one
// once all ended (onComplete), whose payload gets the batch's counts.
//
//	go run . serve                    # terminal 1: the system (jobbus serve)
//	go run ./examples/workflow        # terminal 2: this example
//	jobbus workflow status words-N    # the id it printed: the steps, or the dashboard's graph
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/worker"
)

func main() {
	url := flag.String("nats", "nats://127.0.0.1:4222", "NATS URL of the jobbus system")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *url); err != nil {
		fmt.Fprintln(os.Stderr, "workflow:", err)
		os.Exit(1)
	}
}

// sum adds up the results of the step's parents: word counts.
func sum(ctx context.Context, _ int, _ struct{}) (string, error) {
	parents, err := worker.ParentResults(ctx)
	if err != nil {
		return "", err
	}
	total := 0
	for _, p := range parents {
		if p.Result == nil {
			continue
		}
		n, err := strconv.Atoi(*p.Result)
		if err != nil {
			return "", worker.Permanent(fmt.Errorf("step %s: result %q is not a count", p.Step, *p.Result))
		}
		total += n
	}
	return strconv.Itoa(total), nil
}

func run(ctx context.Context, url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()

	// A worker of the built-in tasks and of SUM, for as long as the example runs.
	w, err := worker.New(nc, worker.WithCapacity(8), worker.WithLogger(nil))
	if err != nil {
		return err
	}
	defer w.Close()
	if err := worker.HandleJSON(w, "SUM", sum); err != nil {
		return err
	}
	wctx, stopWorker := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = w.Run(wctx)
	}()
	// Run says goodbye to the coordinator when wctx ends: without waiting for it, the
	// worker stays listed until its heartbeat times out and gets the next jobs.
	defer func() {
		stopWorker()
		<-ran
	}()

	c := client.New(nc, client.WithTimeout(10*time.Second))
	// SUM is known once the worker registered it: a step of an unknown type is refused.
	if err := registered(ctx, c, w.ID()); err != nil {
		return err
	}
	id := fmt.Sprintf("words-%d", time.Now().Unix())
	wf := client.NewWorkflow(id).
		Step("fetch", "SHA256", map[string]string{"text": "the input"}).
		Step("count-a", "WORD_COUNT", map[string]string{"text": "one two three"}, client.StepAfter("fetch")).
		Step("count-b", "WORD_COUNT", map[string]string{"text": "four five"}, client.StepAfter("fetch")).
		Step("count-c", "WORD_COUNT", map[string]string{"text": "six"}, client.StepAfter("fetch")).
		Step("total", "SUM", map[string]any{}, client.StepAfter("count-a", "count-b", "count-c"))
	sub, err := c.SubmitWorkflow(ctx, wf)
	if err != nil {
		return fmt.Errorf("submit workflow: %w", err)
	}
	fmt.Printf("workflow %s submitted: %d steps, all stored at once\n", sub.WorkflowID, len(sub.Jobs))
	st, err := c.WaitWorkflow(ctx, sub.WorkflowID)
	if err != nil {
		return err
	}
	total, err := c.Status(ctx, sub.Jobs["total"])
	if err != nil {
		return err
	}
	fmt.Printf("workflow %s %s; total words: %s\n", st.WorkflowID, st.State, deref(total.Result))
	for _, s := range st.Steps {
		fmt.Printf("  %-8s %-9s after %s\n", s.Name, s.State, strings.Join(s.After, ", "))
	}

	batch := client.NewBatch(id+"-hashes").
		Step("", "SHA256", map[string]string{"text": "a"}).
		Step("", "SHA256", map[string]string{"text": "b"}).
		Step("", "SHA256", map[string]string{"text": "c"}).
		OnSuccess("WORD_COUNT", map[string]string{"text": "all three hashed"}).
		OnComplete("WORD_COUNT", map[string]string{"text": "batch over"})
	bsub, err := c.SubmitWorkflow(ctx, batch)
	if err != nil {
		return fmt.Errorf("submit batch: %w", err)
	}
	bst, err := c.WaitWorkflow(ctx, bsub.WorkflowID)
	if err != nil {
		return err
	}
	fmt.Printf("batch %s %s: %v\n", bst.WorkflowID, bst.State, bst.Counts)
	return nil
}

// registered waits until the coordinator lists the worker id.
func registered(ctx context.Context, c *client.Client, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		ws, err := c.Workers(ctx)
		if err != nil {
			return err
		}
		for _, w := range ws {
			if w.WorkerID == id {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("worker %s not registered: %w", id, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
