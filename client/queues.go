package client

import (
	"context"
	"errors"

	"github.com/jobbus/jobbus/bus/protocol"
)

// Named queues (a jobbus extension, also served on the TCP client port): a job goes to
// a queue (Queue; default "default"), workers serve queues by weight or in strict
// order, and a queue can be paused and limited. The admin calls below are the
// jobbus.api.queue.* endpoints.

// Queues lists every queue the coordinator knows, by name, each with its depth,
// running jobs, rates and settings.
func (c *Client) Queues(ctx context.Context) ([]protocol.QueueInfo, error) {
	r, err := answer[protocol.QueueList](ctx, c, &protocol.ListQueues{})
	if err != nil {
		return nil, err
	}
	return r.Queues, nil
}

// PauseQueue pauses a known queue, durably (across restarts and failovers): it keeps
// accepting jobs and starts none until resumed. Pausing a paused queue changes
// nothing. An unknown queue is an error for which IsUnknownQueue is true.
func (c *Client) PauseQueue(ctx context.Context, name string) (protocol.QueueInfo, error) {
	return c.queueUpdate(ctx, &protocol.PauseQueue{Queue: name})
}

// ResumeQueue resumes a known queue.
func (c *Client) ResumeQueue(ctx context.Context, name string) (protocol.QueueInfo, error) {
	return c.queueUpdate(ctx, &protocol.ResumeQueue{Queue: name})
}

// QueueSetting changes one of a queue's limits (SetQueue).
type QueueSetting func(*protocol.SetQueue)

// MaxRunning bounds the queue's RUNNING jobs across all workers (0: unbounded).
func MaxRunning(n int) QueueSetting { return func(s *protocol.SetQueue) { s.MaxRunning = &n } }

// KeyConcurrency bounds the RUNNING jobs of one concurrency key in the queue, for task
// types that set no bound of their own (0: unbounded).
func KeyConcurrency(n int) QueueSetting {
	return func(s *protocol.SetQueue) { s.KeyConcurrency = &n }
}

// SetQueue changes a queue's limits, durably, creating the queue if need be; the
// limits not given keep their values.
func (c *Client) SetQueue(ctx context.Context, name string, settings ...QueueSetting) (protocol.QueueInfo, error) {
	req := &protocol.SetQueue{Queue: name}
	for _, s := range settings {
		s(req)
	}
	return c.queueUpdate(ctx, req)
}

func (c *Client) queueUpdate(ctx context.Context, req protocol.Message) (protocol.QueueInfo, error) {
	r, err := answer[protocol.QueueUpdated](ctx, c, req)
	if err != nil {
		return protocol.QueueInfo{}, err
	}
	return r.Queue, nil
}

// IsUnknownQueue reports whether err says the queue named is not known.
func IsUnknownQueue(err error) bool {
	var se *ServerError
	return errors.As(err, &se) && protocol.IsUnknownQueue(se.Message)
}

// Queue sends the job to the named queue (default "default"): 1 to 64 characters of
// A-Z, a-z, 0-9, '_' and '-'.
func Queue(name string) SubmitOption { return func(s *protocol.SubmitJob) { s.Queue = name } }

// ConcurrencyKey gives the job a concurrency key: the jobs of one key in a queue take
// turns with those of other keys, and at most the queue's (or task type's) key
// concurrency of them run at once. A task type may take the key from the payload
// instead (its options' concurrencyKey, a JSON Pointer).
func ConcurrencyKey(key string) SubmitOption {
	return func(s *protocol.SubmitJob) { s.ConcurrencyKey = key }
}
