package main

import (
	"context"
	"testing"
	"time"

	"github.com/jobbus/jobbus/client"
	"github.com/jobbus/jobbus/coordinator"
	"github.com/jobbus/jobbus/internal/jobbustest"
)

// TestRunLeavesNoWorkerBehind runs the example against a system and checks that its
// worker said goodbye before the program ended: a worker still listed gets the next
// jobs submitted, and they wait for its heartbeat timeout and then retry.
func TestRunLeavesNoWorkerBehind(t *testing.T) {
	sys := jobbustest.Start(t, jobbustest.WithCoordinatorConfig(func(c *coordinator.Config) {
		c.HeartbeatTimeout = time.Minute // only a goodbye takes the worker off the list
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, sys.Server.ClientURL()); err != nil {
		t.Fatalf("run: %v", err)
	}
	ws, err := client.New(sys.NC).Workers(ctx)
	if err != nil {
		t.Fatalf("workers: %v", err)
	}
	for _, w := range ws {
		t.Errorf("worker %s still listed after the example ended: the next jobs are assigned to it", w.WorkerID)
	}
}
