// Package workercfg holds the settings every jobbus worker has, the native one and the
// spec TCP one alike: its id, capacity, heartbeat interval, task registry and logger,
// with their defaults and their checks. Each worker embeds Common in its own config and
// keeps its own options.
package workercfg

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/worker/tasks"
)

// Common is the settings shared by every worker.
type Common struct {
	ID        string
	Capacity  int
	Heartbeat time.Duration
	Registry  *tasks.Registry
	Logger    *slog.Logger
	// Queues are the queues served, with weights (none: protocol.DefaultQueue);
	// StrictQueues takes them in order instead of by weight.
	Queues       []protocol.QueueWeight
	StrictQueues bool
}

// New returns settings with the given capacity and heartbeat and slog.Default(); the
// id and registry are left for Complete.
func New(capacity int, heartbeat time.Duration) Common {
	return Common{Capacity: capacity, Heartbeat: heartbeat, Logger: slog.Default()}
}

// Complete fills in what the options left unset: a random id and the built-in tasks.
func (c *Common) Complete() {
	if c.ID == "" {
		c.ID = RandomID()
	}
	if c.Registry == nil {
		c.Registry = tasks.Builtins()
	}
}

// Validate returns every problem of the shared settings, for the worker to join with
// its own.
func (c *Common) Validate() []error {
	var errs []error
	if c.Capacity < protocol.MinCapacity || c.Capacity > protocol.MaxCapacity {
		errs = append(errs, fmt.Errorf("capacity must be in %d..%d, got %d",
			protocol.MinCapacity, protocol.MaxCapacity, c.Capacity))
	}
	if c.Heartbeat <= 0 {
		errs = append(errs, fmt.Errorf("heartbeat interval must be positive, got %v", c.Heartbeat))
	}
	if err := protocol.CheckQueueWeights(c.Queues); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// Logger is l, or a logger that discards when l is nil.
func Logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// RandomID is "worker-" and 8 random hex digits.
func RandomID() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "worker-" + hex.EncodeToString(b[:])
}
